package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// A committed event arrives once, signed (with every secret of a
// rotation), with the event id as webhook-id and txoutbox-id, every
// metadata header, and the payload byte for byte.
func TestDeliverSignedWithMetadata(t *testing.T) {
	oldSecret, newSecret := webhook.NewSecret(), webhook.NewSecret()
	rcv := newReceiver(t, newSecret) // the receiver knows only the new one
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: oldSecret, Secrets: []string{newSecret}})
	f := start(t, outbox.Subscription{Name: uniqueName("signed"), Handler: pub.Handler()})

	at := time.Date(2026, 11, 23, 10, 0, 0, 123456000, time.UTC) // the store keeps microseconds
	jsonEnv := outbox.Envelope{
		Type: "order.placed", AggregateType: "order", AggregateID: "42", TenantID: "acme",
		OccurredAt: at, JSON: []byte(`{"id":42, "item":"book"}`),
		Headers: map[string]string{
			"customer-tier": "gold",
			"traceparent":   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":    "vendor=x",
		},
	}
	binary := []byte{0, 1, 2, 0xff, '\n', 0xfe}
	bytesEnv := outbox.Envelope{Type: "blob", Bytes: binary, Headers: map[string]string{"content-type": "application/x-protobuf"}}
	ids := f.publish(jsonEnv, bytesEnv)
	for _, id := range ids {
		if d := f.settle(id, 10*time.Second); d.Status != outbox.StatusDone || d.Attempts != 0 {
			t.Fatalf("event %s: %+v, want done at the first attempt", id, d)
		}
	}

	ps := rcv.PostsOf(ids[0])
	if len(ps) != 1 {
		t.Fatalf("got %d posts of the JSON event, want 1", len(ps))
	}
	p := ps[0]
	if p.VerifyErr != nil {
		t.Fatalf("Verify: %v", p.VerifyErr)
	}
	if err := webhook.Verify(oldSecret, p.Header, p.Body, 0); err != nil {
		t.Fatalf("Verify with the old secret: %v", err)
	}
	if sigs := strings.Fields(p.Header.Get(webhook.HeaderSignature)); len(sigs) != 2 {
		t.Fatalf("webhook-signature %q: want two signatures (rotation)", sigs)
	}
	want := map[string]string{
		webhook.HeaderID:   ids[0],
		meta.ID:            ids[0],
		meta.Type:          "order.placed",
		meta.AggregateType: "order",
		meta.AggregateID:   "42",
		meta.TenantID:      "acme",
		meta.OccurredAt:    "2026-11-23T10:00:00.123456Z",
		"Content-Type":     "application/json",
		"customer-tier":    "gold",
		"traceparent":      jsonEnv.Headers["traceparent"],
		"tracestate":       "vendor=x",
	}
	for k, v := range want {
		if got := p.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if !bytes.Equal(p.Body, jsonEnv.JSON) {
		t.Errorf("body %q, want %q", p.Body, jsonEnv.JSON)
	}

	ps = rcv.PostsOf(ids[1])
	if len(ps) != 1 || ps[0].VerifyErr != nil {
		t.Fatalf("bytes event: %d posts, %v", len(ps), ps)
	}
	if !bytes.Equal(ps[0].Body, binary) || ps[0].Header.Get("Content-Type") != "application/x-protobuf" {
		t.Errorf("bytes event: body %x content-type %q", ps[0].Body, ps[0].Header.Get("Content-Type"))
	}
}

// A rolled-back transaction sends nothing: only the event committed after
// it arrives.
func TestRollbackSendsNothing(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	f := start(t, outbox.Subscription{Name: uniqueName("rollback"), Handler: pub.Handler()})

	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, f.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack, err := f.ob.PublishTx(ctx, tx, outbox.Envelope{Type: "t", JSON: []byte(`{"n":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	fence := f.publish(outbox.Envelope{Type: "t", JSON: []byte(`{"n":2}`)})[0]
	f.settle(fence, 10*time.Second)
	// Poll once more, so that anything the poller could find has been sent.
	if _, err := f.ob.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range rcv.Posts() {
		if p.ID != fence {
			t.Fatalf("received %s (rolled back: %s)", p.ID, rolledBack)
		}
	}
	if n := len(rcv.Posts()); n != 1 {
		t.Fatalf("%d posts, want 1", n)
	}
}

// A redelivered event (the process died before its DONE was written)
// carries the same webhook-id, so the receiver stores it once.
func TestRedeliverySameWebhookID(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	h := pub.Handler()
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{"a":1}`)}, Attempt: 1}
	ctx := context.Background()
	for i := range 2 {
		if err := h(ctx, ev); err != nil {
			t.Fatalf("delivery %d: %v", i+1, err)
		}
	}
	ps := rcv.Posts()
	if len(ps) != 2 || ps[0].ID != ev.ID || ps[1].ID != ev.ID {
		t.Fatalf("posts %+v: want two with webhook-id %s", ps, ev.ID)
	}
	for _, p := range ps {
		if p.VerifyErr != nil {
			t.Fatal(p.VerifyErr)
		}
	}
	if n := rcv.Stored(); n != 1 {
		t.Fatalf("receiver stored %d events, want 1 (de-duplicated on webhook-id)", n)
	}
}

// A payload over MaxBodyBytes is dead at the first attempt and never sent.
func TestMaxBodyBytesIsPermanent(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret, MaxBodyBytes: 1024})
	f := start(t, outbox.Subscription{Name: uniqueName("maxbody"), Handler: pub.Handler()})

	big := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", 2000))
	ids := f.publish(outbox.Envelope{Type: "t", JSON: []byte(big)}, outbox.Envelope{Type: "t", JSON: []byte(`{}`)})
	d := f.settle(ids[0], 10*time.Second)
	if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "over MaxBodyBytes (1024)") {
		t.Fatalf("oversized event: %+v, want dead at the first attempt over MaxBodyBytes", d)
	}
	if d := f.settle(ids[1], 10*time.Second); d.Status != outbox.StatusDone {
		t.Fatalf("small event: %+v", d)
	}
	if n := len(rcv.PostsOf(ids[0])); n != 0 {
		t.Fatalf("the oversized event was sent %d times", n)
	}
}

// A receiver that refuses a body as too large (413) makes it dead at
// once too.
func TestReceiverTooLargeIsDead(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	rcv.respond(func(p post, n int) (int, http.Header) {
		if len(p.Body) > 100 {
			return http.StatusRequestEntityTooLarge, nil
		}
		return http.StatusOK, nil
	})
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	f := start(t, outbox.Subscription{Name: uniqueName("toolarge"), Handler: pub.Handler()})
	id := f.publish(outbox.Envelope{Type: "t", Bytes: bytes.Repeat([]byte{7}, 200)})[0]
	d := f.settle(id, 10*time.Second)
	if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "413") {
		t.Fatalf("%+v, want dead at the first attempt with 413", d)
	}
}

// 410 Gone: dead at once, after one request.
func TestGoneIsDeadAtOnce(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	rcv.respond(func(post, int) (int, http.Header) { return http.StatusGone, nil })
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	f := start(t, outbox.Subscription{Name: uniqueName("gone"), Handler: pub.Handler()})
	id := f.publish(outbox.Envelope{Type: "t", JSON: []byte(`{}`)})[0]
	d := f.settle(id, 10*time.Second)
	if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "410 Gone") {
		t.Fatalf("%+v, want dead at the first attempt with 410 Gone", d)
	}
	if strings.Contains(d.LastError, "RESPONSE-BODY") {
		t.Fatalf("the response body reached the error: %q", d.LastError)
	}
	if n := len(rcv.PostsOf(id)); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
}

// 500 retries (spending attempts), then a 2xx delivers: same webhook-id
// every time.
func TestServerErrorRetriesThenDone(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	rcv.respond(func(_ post, n int) (int, http.Header) {
		if n <= 2 {
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	})
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	f := start(t, outbox.Subscription{Name: uniqueName("retry"), Handler: pub.Handler()})
	id := f.publish(outbox.Envelope{Type: "t", JSON: []byte(`{}`)})[0]
	d := f.settle(id, 10*time.Second)
	if d.Status != outbox.StatusDone || d.Attempts != 2 {
		t.Fatalf("%+v, want done after 2 failed attempts", d)
	}
	ps := rcv.PostsOf(id)
	if len(ps) != 3 {
		t.Fatalf("%d requests, want 3", len(ps))
	}
	if rcv.Stored() != 1 {
		t.Fatalf("stored %d", rcv.Stored())
	}
}

// 429 with Retry-After: the next request comes no earlier than it asked,
// and no attempt is spent; so does a 503.
func TestRetryAfterRespected(t *testing.T) {
	for _, code := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			secret := webhook.NewSecret()
			rcv := newReceiver(t, secret)
			rcv.respond(func(_ post, n int) (int, http.Header) {
				if n == 1 {
					return code, http.Header{"Retry-After": {"1"}}
				}
				return http.StatusOK, nil
			})
			pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
			f := start(t, outbox.Subscription{Name: uniqueName("ratelimit"), Handler: pub.Handler(),
				CircuitProbe: 50 * time.Millisecond, CircuitMaxProbe: 100 * time.Millisecond})
			id := f.publish(outbox.Envelope{Type: "t", JSON: []byte(`{}`)})[0]
			d := f.settle(id, 10*time.Second)
			if d.Status != outbox.StatusDone || d.Attempts != 0 {
				t.Fatalf("%+v, want done without a spent attempt", d)
			}
			ps := rcv.PostsOf(id)
			if len(ps) != 2 {
				t.Fatalf("%d requests, want 2", len(ps))
			}
			// Retry-After is whole seconds; the wait is from the answer,
			// which came after the first request arrived.
			if gap := ps[1].At.Sub(ps[0].At); gap < time.Second {
				t.Fatalf("second request %s after the first, want at least Retry-After (1s)", gap)
			}
		})
	}
}

// A redirect is not followed: dead at once, naming the Location.
func TestRedirectNotFollowed(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	var elsewhere atomic.Int32
	rcv.srv.Config.Handler.(*http.ServeMux).HandleFunc("/elsewhere", func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	})
	rcv.respond(func(post, int) (int, http.Header) {
		return http.StatusTemporaryRedirect, http.Header{"Location": {"/elsewhere"}}
	})
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	f := start(t, outbox.Subscription{Name: uniqueName("redirect"), Handler: pub.Handler()})
	id := f.publish(outbox.Envelope{Type: "t", JSON: []byte(`{}`)})[0]
	d := f.settle(id, 10*time.Second)
	if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "307") || !strings.Contains(d.LastError, "/elsewhere") {
		t.Fatalf("%+v, want dead at once naming 307 and /elsewhere", d)
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect was followed %d times", n)
	}
}

// The endpoint goes away mid-stream (its connections cut, new ones
// refused) and comes back: nothing is lost, nothing is dead, no attempt
// is spent.
func TestOutage(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	target, err := testbroker.HostPort(rcv.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testbroker.NewProxy(t, target)
	pub := newPublisher(t, webhook.Config{URL: testbroker.WithHost(rcv.URL(), proxy.Addr()), Secret: secret, Timeout: time.Second})
	h := pub.Handler()
	var unavailable atomic.Int32
	outage := make(chan struct{}, 1)
	f := start(t, outbox.Subscription{
		Name: uniqueName("outage"),
		Handler: func(ctx context.Context, ev outbox.Event) error {
			err := h(ctx, ev)
			if down, _ := outbox.IsUnavailable(err); down {
				unavailable.Add(1)
				select {
				case outage <- struct{}{}:
				default:
				}
			}
			return err
		},
		Concurrency:     4,
		CircuitProbe:    100 * time.Millisecond,
		CircuitMaxProbe: 200 * time.Millisecond,
	})

	const perPhase = 30
	var ids []string
	stream := func(n int) {
		for i := range n {
			ids = append(ids, f.publish(outbox.Envelope{Type: "t", JSON: fmt.Appendf(nil, `{"n":%d}`, len(ids)+i)})...)
			time.Sleep(2 * time.Millisecond) // a steady stream, not a burst
		}
	}
	stream(perPhase)
	rcv.waitStored(t, perPhase/2, 10*time.Second)
	proxy.Cut()
	stream(perPhase)
	select {
	case <-outage:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery failed while the endpoint was cut")
	}
	proxy.Restore()
	stream(perPhase)

	rcv.waitStored(t, len(ids), 20*time.Second)
	for _, id := range ids {
		d := f.settle(id, 20*time.Second)
		if d.Status != outbox.StatusDone || d.Attempts != 0 {
			t.Fatalf("event %s: %+v, want done without a spent attempt", id, d)
		}
	}
	if rcv.Stored() != len(ids) {
		t.Fatalf("stored %d, published %d", rcv.Stored(), len(ids))
	}
	t.Logf("%d events, %d requests, %d unavailable answers", len(ids), len(rcv.Posts()), unavailable.Load())
	if unavailable.Load() == 0 {
		t.Fatal("the outage was not seen")
	}
}

// In one Batch call, each event gets its own outcome: the one the
// receiver refuses is dead, the others are delivered.
func TestBatchOwnOutcomes(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	rcv.respond(func(p post, _ int) (int, http.Header) {
		if p.Header.Get("bad") != "" {
			return http.StatusUnprocessableEntity, nil
		}
		return http.StatusAccepted, nil
	})
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret, BatchConcurrency: 4})
	bh := pub.BatchHandler()

	t.Run("direct", func(t *testing.T) {
		evs := make([]outbox.Event, 6)
		for i := range evs {
			evs[i] = outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`)}}
		}
		evs[3].Headers = map[string]string{"bad": "1"}
		err := bh(context.Background(), evs)
		var be *outbox.BatchError
		if !errors.As(err, &be) || len(be.Errs) != len(evs) {
			t.Fatalf("err %v, want a *outbox.BatchError of %d", err, len(evs))
		}
		for i, e := range be.Errs {
			if (e != nil) != (i == 3) {
				t.Errorf("event %d: %v", i, e)
			}
		}
		if outbox.DefaultClassifier(be.Errs[3]) != outbox.DecisionDead {
			t.Errorf("422 is not permanent: %v", be.Errs[3])
		}
	})

	t.Run("engine", func(t *testing.T) {
		var mu sync.Mutex
		largest := 0
		f := start(t, outbox.Subscription{
			Name: uniqueName("batch"),
			Batch: func(ctx context.Context, evs []outbox.Event) error {
				mu.Lock()
				largest = max(largest, len(evs))
				mu.Unlock()
				return bh(ctx, evs)
			},
			BatchSize:   20,
			BatchLinger: 50 * time.Millisecond,
		})
		envs := make([]outbox.Envelope, 10)
		for i := range envs {
			envs[i] = outbox.Envelope{Type: "t", JSON: fmt.Appendf(nil, `{"n":%d}`, i)}
		}
		envs[4].Headers = map[string]string{"bad": "yes"}
		ids := f.publish(envs...)
		for i, id := range ids {
			d := f.settle(id, 10*time.Second)
			switch {
			case i == 4 && (d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "422")):
				t.Errorf("bad event: %+v, want dead with 422", d)
			case i != 4 && d.Status != outbox.StatusDone:
				t.Errorf("event %d: %+v, want done", i, d)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if largest < 2 {
			t.Fatalf("largest batch %d: the events were not batched", largest)
		}
	})
}
