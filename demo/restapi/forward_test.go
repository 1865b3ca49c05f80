package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// With NATS_URL set, a POST /orders ends up as a message on the stream:
// subject orders.<type>, Nats-Msg-Id and txoutbox-id the event's id, the
// order as body; a cancel adds the OrderCancelled message.
func TestForwardsToNATS(t *testing.T) {
	url := testbroker.NATS(t)
	// A stream and subjects of its own, so that tests sharing the
	// server do not meet; deleted after the app has closed.
	id := strings.ToLower(outbox.NewID())
	stream, prefix := "DEMO_TEST_"+strings.ToUpper(id), "demotest"+id
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), stream) })

	h := startTestAppWith(t, "", func(o *appOptions) {
		o.config.NATSURL = url
		o.natsStream, o.natsSubjectPrefix = stream, prefix
	})
	if status, body := h.do(t, http.MethodPost, "/orders", validOrder); status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	if status, body := h.do(t, http.MethodPost, "/orders/1/cancel", ""); status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs, err := h.rec.WaitFor(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}

	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("the app did not create the stream %s: %v", stream, err)
	}
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range evs {
		msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			t.Fatalf("message %d (%s): %v", i+1, want.Type, err)
		}
		hd := msg.Headers()
		if msg.Subject() != prefix+"."+want.Type.String() || hd.Get("Nats-Msg-Id") != want.ID || hd.Get("txoutbox-id") != want.ID ||
			hd.Get("txoutbox-aggregate-id") != "1" {
			t.Errorf("message %d: subject %s, Nats-Msg-Id %s, headers %v; want %s.%s about order 1 with id %s",
				i+1, msg.Subject(), hd.Get("Nats-Msg-Id"), hd, prefix, want.Type, want.ID)
		}
		if string(msg.Data()) != string(want.JSON) {
			t.Errorf("message %d: body %s, want the event's payload %s", i+1, msg.Data(), want.JSON)
		}
	}
	var placed orderPlaced
	if err := json.Unmarshal(evs[0].JSON, &placed); err != nil || placed.Customer != "ada" {
		t.Errorf("OrderPlaced payload %s (%v), want ada's order", evs[0].JSON, err)
	}
}

// With WEBHOOK_URL and WEBHOOK_SECRET set, every event is POSTed to the
// endpoint, signed: the receiver verifies it with webhook.Verify.
func TestForwardsToWebhook(t *testing.T) {
	secret := webhook.NewSecret()
	type request struct {
		header http.Header
		body   []byte
		err    error // from webhook.Verify
	}
	got := make(chan request, 4)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := webhook.Verify(secret, r.Header, body, time.Minute)
		select {
		case got <- request{r.Header.Clone(), body, err}:
		default:
		}
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close) // registered first: runs after the app has closed

	h := startTestAppWith(t, "", func(o *appOptions) {
		o.config.WebhookURL, o.config.WebhookSecret = recv.URL+"/hooks/orders", secret
	})
	if status, body := h.do(t, http.MethodPost, "/orders", validOrder); status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs, err := h.rec.WaitFor(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the request does not verify: %v", r.err)
		}
		if r.header.Get("webhook-id") != evs[0].ID || r.header.Get("txoutbox-type") != string(OrderPlaced) ||
			r.header.Get("Content-Type") != "application/json" || string(r.body) != string(evs[0].JSON) {
			t.Errorf("got %v %s; want OrderPlaced %s with its payload %s", r.header, r.body, evs[0].ID, evs[0].JSON)
		}
	case <-ctx.Done():
		t.Fatal("no request within 30s")
	}
	h.waitDelivered(t)
}

// A misconfigured connector stops the start with an error that names the
// variable; nothing is left running (leakcheck).
func TestForwardingMisconfigured(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  func(*config)
		want string
	}{
		"webhook without secret": {func(c *config) { c.WebhookURL = "http://127.0.0.1:9/hooks" }, "WEBHOOK_SECRET is not"},
		"bad secret":             {func(c *config) { c.WebhookURL, c.WebhookSecret = "http://127.0.0.1:9/hooks", "whsec_Sup3rSecret!" }, "WEBHOOK_SECRET"},
		"relative webhook URL":   {func(c *config) { c.WebhookURL, c.WebhookSecret = "/hooks", webhook.NewSecret() }, "WEBHOOK_URL"},
		"NATS not there":         {func(c *config) { c.NATSURL = "nats://127.0.0.1:1" }, "NATS_URL"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			cfg.DataDir = t.TempDir()
			tc.cfg(&cfg)
			a, err := newApp(context.Background(), appOptions{config: cfg, logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err == nil {
				a.close(context.Background())
				t.Fatal("newApp succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "Sup3rSecret") {
				t.Errorf("error %q shows the secret", err)
			}
		})
	}
}
