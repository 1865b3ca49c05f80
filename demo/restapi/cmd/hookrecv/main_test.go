package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/outbox"
)

// syncBuffer is a strings.Builder safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// What the demo's connector sends, the receiver verifies and prints; a
// redelivery is printed as a duplicate and answered 2xx; a request signed
// with another secret is refused with 401, which the connector reports as
// permanent (the event would be DEAD).
func TestReceiverVerifiesWhatTheConnectorSends(t *testing.T) {
	secret := webhook.NewSecret()
	var out syncBuffer
	srv := httptest.NewServer(newReceiver(secret, &out))
	defer srv.Close()
	send := func(secret string, ev *outbox.Event) error {
		pub, err := webhook.New(webhook.Config{URL: srv.URL + path, Secret: secret, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		return pub.Send(context.Background(), ev)
	}
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "OrderPlaced", AggregateType: "order", AggregateID: "1",
		JSON: []byte(`{"id": 1, "customer": "ada"}`), OccurredAt: time.Now()}}

	if err := send(secret, ev); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	want := "POST /hooks/orders  webhook-id=" + ev.ID + "  txoutbox-type=OrderPlaced  aggregate=order/1  signature verified\n    {\"id\":1,\"customer\":\"ada\"}\n"
	if got := out.String(); got != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", got, want)
	}
	if err := send(secret, ev); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	if got := out.String(); !strings.HasSuffix(got, "duplicate webhook-id="+ev.ID+": already received, answered 204 again\n") {
		t.Errorf("after a redelivery, printed:\n%s", got)
	}
	err := send(webhook.NewSecret(), &outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "OrderPlaced", JSON: []byte(`{}`), OccurredAt: time.Now()}})
	var se *webhook.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized || outbox.DefaultClassifier(err) != outbox.DecisionDead {
		t.Errorf("another secret: err = %v, want a permanent 401", err)
	}
	if got := out.String(); !strings.Contains(got, "REJECTED") {
		t.Errorf("a bad signature is not reported:\n%s", got)
	}
}

// run prints the URL and a secret, and stops when its context ends.
func TestRunPrintsHowToStartTheDemo(t *testing.T) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", "", pw); pw.Close() }()
	var banner strings.Builder
	sc := bufio.NewScanner(pr)
	for i := 0; i < 3 && sc.Scan(); i++ { // run writes the banner before it serves
		banner.WriteString(sc.Text() + "\n")
	}
	go io.Copy(io.Discard, pr)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := banner.String(); !strings.Contains(got, "WEBHOOK_URL=http://127.0.0.1:") || !strings.Contains(got, "/hooks/orders WEBHOOK_SECRET=whsec_") ||
		!strings.HasSuffix(got, " make run\n") {
		t.Errorf("banner %q does not say how to start the demo", got)
	}
	if err := run(context.Background(), "127.0.0.1:0", "not-a-secret", io.Discard); err == nil || !strings.Contains(err.Error(), "WEBHOOK_SECRET") {
		t.Errorf("a malformed WEBHOOK_SECRET: err = %v", err)
	}
}

func TestMain(m *testing.M) { leakcheck.Main(m) }
