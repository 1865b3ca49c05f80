package amqpoutbox_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A committed event is one message on the broker: message id, properties,
// every metadata header (a user header and the trace context too) and the
// payload byte for byte.
func TestCommitPublishesOneMessage(t *testing.T) {
	tp := newTopology(t, "order.#")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()})

	at := time.Date(2026, 11, 23, 10, 0, 0, 123456000, time.UTC) // the store keeps microseconds
	payload := []byte(`{"id":42,  "item":"book"}`)
	ids := e.publish(t, true, outbox.Envelope{
		Type: "order.created", AggregateType: "order", AggregateID: "42", TenantID: "t1",
		OccurredAt: at, JSON: payload,
		Headers: map[string]string{"x-user": "alice", "traceparent": traceparent, "tracestate": "vendor=1"},
	})
	e.await(t, outbox.StatusDone, 10*time.Second, ids...)

	d, ok := tp.get(t, 5*time.Second)
	if !ok {
		t.Fatal("no message on the queue")
	}
	if d.MessageId != ids[0] {
		t.Errorf("MessageId %q; want the event id %q", d.MessageId, ids[0])
	}
	if d.RoutingKey != "order.created" || d.Exchange != tp.exchange {
		t.Errorf("exchange %q routing key %q", d.Exchange, d.RoutingKey)
	}
	if d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" || d.Type != "order.created" || !d.Timestamp.Equal(at.Truncate(time.Second)) {
		t.Errorf("properties: mode %d, content type %q, type %q, timestamp %v", d.DeliveryMode, d.ContentType, d.Type, d.Timestamp)
	}
	if !bytes.Equal(d.Body, payload) {
		t.Errorf("body %q; want %q", d.Body, payload)
	}
	want := map[string]string{
		meta.ID: ids[0], meta.Type: "order.created", meta.AggregateType: "order", meta.AggregateID: "42",
		meta.TenantID: "t1", meta.OccurredAt: "2026-11-23T10:00:00.123456Z", meta.ContentType: "application/json",
		"x-user": "alice", "traceparent": traceparent, "tracestate": "vendor=1",
	}
	if len(d.Headers) != len(want) {
		t.Errorf("headers %v; want %v", d.Headers, want)
	}
	for k, v := range want {
		if got, _ := d.Headers[k].(string); got != v {
			t.Errorf("header %s = %v; want %q", k, d.Headers[k], v)
		}
	}
	// The consumer's side: the envelope comes back whole.
	var keys []string
	for k := range d.Headers {
		keys = append(keys, k)
	}
	back, err := meta.Envelope(func(k string) string { s, _ := d.Headers[k].(string); return s }, keys, d.Body)
	if err != nil || back.ID != ids[0] || !back.OccurredAt.Equal(at) || back.Headers["traceparent"] != traceparent {
		t.Errorf("meta.Envelope: %+v, %v", back, err)
	}
	if n := tp.count(t); n != 0 {
		t.Errorf("%d more messages on the queue; want exactly one", n)
	}
}

// A rolled-back event never reaches the broker: only the event committed
// after it does.
func TestRollbackPublishesNothing(t *testing.T) {
	tp := newTopology(t, "#")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()})

	e.publish(t, false, outbox.Envelope{Type: "rolled.back", JSON: []byte(`1`)})
	marker := e.publish(t, true, outbox.Envelope{Type: "committed", JSON: []byte(`2`)})
	e.await(t, outbox.StatusDone, 10*time.Second, marker...)

	d, ok := tp.get(t, 5*time.Second)
	if !ok || d.MessageId != marker[0] {
		t.Fatalf("first message %q (%v); want the committed event %s", d.MessageId, ok, marker[0])
	}
	if n := tp.count(t); n != 0 {
		t.Fatalf("%d more messages; want none from the rolled-back transaction", n)
	}
}

// An event delivered twice (the process died before it recorded the
// first delivery) is two messages: RabbitMQ does not de-duplicate. Both
// carry the same message id and txoutbox-id, which consumers
// de-duplicate on.
func TestRedeliveryCarriesTheSameMessageID(t *testing.T) {
	tp := newTopology(t, "#")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "order.created", OccurredAt: time.Now(), JSON: []byte(`{"a":1}`)}, Attempt: 1}
	ctx := context.Background()
	for attempt := 1; attempt <= 2; attempt++ {
		ev.Attempt = attempt
		if err := pub.Handler()(ctx, []outbox.Event{ev}); err != nil {
			t.Fatalf("delivery %d: %v", attempt, err)
		}
	}
	seen := map[string]int{}
	for range 2 {
		d, ok := tp.get(t, 5*time.Second)
		if !ok {
			t.Fatal("fewer than two messages")
		}
		if d.MessageId != ev.ID || d.Headers[meta.ID] != ev.ID {
			t.Errorf("message id %q, txoutbox-id %v; want %s on both", d.MessageId, d.Headers[meta.ID], ev.ID)
		}
		seen[string(d.Body)]++
	}
	if seen[`{"a":1}`] != 2 {
		t.Errorf("bodies %v", seen)
	}
}

// A payload over the broker's limit is DEAD at the first attempt, with
// the reason in its last error, and never sent.
func TestOversizedPayloadIsDeadAtOnce(t *testing.T) {
	tp := newTopology(t, "#")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange, MaxMessageBytes: 1024})
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()})

	big := e.publish(t, true, outbox.Envelope{Type: "big", Bytes: bytes.Repeat([]byte{'x'}, 2048)})
	small := e.publish(t, true, outbox.Envelope{Type: "small", Bytes: bytes.Repeat([]byte{'x'}, 1024)})
	e.await(t, outbox.StatusDead, 10*time.Second, big...)
	e.await(t, outbox.StatusDone, 10*time.Second, small...)
	d := e.state(t, big[0])
	if d.Attempts != 1 || !strings.Contains(d.LastError, "too large") || !strings.Contains(d.LastError, "2048") {
		t.Errorf("dead event: %+v; want 1 attempt and the size in the error", d)
	}
	if m, ok := tp.get(t, 5*time.Second); !ok || m.MessageId != small[0] {
		t.Errorf("got %q (%v); want only the small event", m.MessageId, ok)
	}
	if n := tp.count(t); n != 0 {
		t.Errorf("%d more messages", n)
	}
}

// A batch with one bad event among good ones: each gets its own outcome,
// only the bad one fails. Here the bad one is unroutable (no queue bound
// for its key), which is Permanent by default.
func TestBatchOutcomePerEvent(t *testing.T) {
	tp := newTopology(t, "good.*")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	var evs []outbox.Event
	for i := range 10 {
		typ := outbox.EventType("good.x")
		if i == 6 {
			typ = "bad.x"
		}
		evs = append(evs, outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: typ, JSON: []byte(`{}`)}, Attempt: 1})
	}
	errs := outcomes(t, pub.Publish(context.Background(), evs), len(evs))
	for i, err := range errs {
		switch {
		case i == 6 && (!isPermanent(err) || !strings.Contains(err.Error(), "unroutable")):
			t.Errorf("bad event: %v; want a Permanent unroutable error", err)
		case i != 6 && err != nil:
			t.Errorf("event %d: %v; want delivered", i, err)
		}
	}
	if n := tp.count(t); n != 9 {
		t.Errorf("%d messages on the queue; want the 9 good ones", n)
	}

	// The same through the engine: 9 DONE, the bad one DEAD at once.
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler(), BatchLinger: 50 * time.Millisecond})
	var envs []outbox.Envelope
	for i := range 10 {
		typ := outbox.EventType("good.y")
		if i == 3 {
			typ = "bad.y"
		}
		envs = append(envs, outbox.Envelope{Type: typ, JSON: []byte(`{}`)})
	}
	ids := e.publish(t, true, envs...)
	e.await(t, outbox.StatusDead, 10*time.Second, ids[3])
	e.await(t, outbox.StatusDone, 10*time.Second, append(ids[:3:3], ids[4:]...)...)
	if d := e.state(t, ids[3]); d.Attempts != 1 || !strings.Contains(d.LastError, "no queue is bound") {
		t.Errorf("unroutable event: %+v", d)
	}
}

// The unroutable policy: retry spends attempts, unavailable does not,
// drop counts as delivered.
func TestUnroutablePolicies(t *testing.T) {
	tp := newTopology(t, "") // nothing bound: every message is unroutable
	ev := []outbox.Event{{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "nowhere", JSON: []byte(`{}`)}, Attempt: 1}}
	for _, c := range []struct {
		policy amqpoutbox.Unroutable
		check  func(error) bool
	}{
		{amqpoutbox.UnroutablePermanent, isPermanent},
		{amqpoutbox.UnroutableRetry, func(err error) bool { return err != nil && !isPermanent(err) && !isUnavailable(err) }},
		{amqpoutbox.UnroutableUnavailable, isUnavailable},
		{amqpoutbox.UnroutableDrop, func(err error) bool { return err == nil }},
	} {
		pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange, Unroutable: c.policy})
		if err := outcomes(t, pub.Publish(context.Background(), ev), 1)[0]; !c.check(err) {
			t.Errorf("policy %d: %v", c.policy, err)
		}
	}
}

// A missing exchange is the destination being unavailable, not the
// event's fault: no attempt is spent; once the exchange exists, the
// events flow.
func TestMissingExchangeIsUnavailable(t *testing.T) {
	tp := newTopology(t, "#")
	missing := unique(t, "missing")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: missing})
	if err := pub.Connect(context.Background()); err == nil || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Errorf("Connect: %v; want the exchange not found", err)
	}
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler(),
		CircuitProbe: 50 * time.Millisecond, CircuitMaxProbe: 100 * time.Millisecond})
	ids := e.publish(t, true, outbox.Envelope{Type: "a", JSON: []byte(`1`)}, outbox.Envelope{Type: "b", JSON: []byte(`2`)})
	deadline := time.Now().Add(5 * time.Second)
	for e.state(t, ids[0]).LastError == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d := e.state(t, ids[0]); !strings.Contains(d.LastError, "NOT_FOUND") || d.Attempts != 0 || d.Status == outbox.StatusDead {
		t.Errorf("before the exchange exists: %+v; want NOT_FOUND, 0 attempts", d)
	}
	if err := tp.ch.ExchangeDeclare(missing, "fanout", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := tp.ch.QueueBind(tp.queue, "", missing, false, nil); err != nil {
		t.Fatal(err)
	}
	e.await(t, outbox.StatusDone, 10*time.Second, ids...)
	for _, id := range ids {
		if d := e.state(t, id); d.Attempts != 0 {
			t.Errorf("event %s: %+v; want no attempt spent", id, d)
		}
	}
}

// OUTAGE: RabbitMQ goes away mid-stream (a proxy cuts every connection
// and refuses new ones) while events keep coming, then returns. Nothing
// is lost, nothing is DEAD, no attempt is spent, everything arrives.
func TestOutageLosesNothing(t *testing.T) {
	tp := newTopology(t, "#")
	addr, err := testbroker.HostPort(tp.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testbroker.NewProxy(t, addr)
	pub := newPublisher(t, amqpoutbox.Config{URL: testbroker.WithHost(tp.url, proxy.Addr()), Exchange: tp.exchange, DialTimeout: time.Second})
	e := newEnv(t, outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler(), Timeout: 2 * time.Second,
		CircuitThreshold: 3, CircuitProbe: 100 * time.Millisecond, CircuitMaxProbe: 200 * time.Millisecond})

	// Consume in the background, counting every id.
	got := map[string]int{}
	var mu sync.Mutex
	msgs, err := tp.ch.Consume(tp.queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var consumed sync.WaitGroup
	consumed.Go(func() {
		for d := range msgs {
			mu.Lock()
			got[d.MessageId]++
			mu.Unlock()
		}
	})
	t.Cleanup(consumed.Wait)
	t.Cleanup(func() { tp.ch.Close() })

	var ids []string
	stream := func(n int) {
		for range n {
			ids = append(ids, e.publish(t, true, outbox.Envelope{Type: "tick", JSON: []byte(`{}`)})...)
			time.Sleep(5 * time.Millisecond) // a steady stream, not a burst
		}
	}
	stream(50)
	proxy.Cut()
	cutAt := time.Now()
	stream(50)
	// Let the circuit open and probe against the dead broker a while.
	for time.Since(cutAt) < 700*time.Millisecond {
		stream(1)
	}
	proxy.Restore()
	stream(50)

	e.await(t, outbox.StatusDone, 30*time.Second, ids...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	lost, dup, spent := 0, 0, 0
	for _, id := range ids {
		switch got[id] {
		case 0:
			lost++
		case 1:
		default:
			dup++
		}
		if d := e.state(t, id); d.Attempts != 0 || d.Status != outbox.StatusDone {
			spent++
			if spent == 1 {
				t.Errorf("event %s: %+v; want DONE with no attempt spent", id, d)
			}
		}
	}
	if lost != 0 || spent != 0 {
		t.Errorf("of %d events: %d lost, %d with attempts spent or not DONE", len(ids), lost, spent)
	}
	stats, err := e.store.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if stats.Dead != 0 {
		t.Errorf("%d DEAD; want 0", stats.Dead)
	}
	t.Logf("%d events through an outage of %v: %d lost, %d delivered twice (at least once; consumers de-duplicate on the message id)", len(ids), 700*time.Millisecond, lost, dup)
}

// After Close, calls fail as Unavailable and Close has waited for the
// Publisher's goroutines (leakcheck checks the rest).
func TestClose(t *testing.T) {
	tp := newTopology(t, "#")
	pub := newPublisher(t, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	ev := []outbox.Event{{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "a", JSON: []byte(`{}`)}, Attempt: 1}}
	if err := pub.Publish(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	err := pub.Publish(context.Background(), ev)
	if !isUnavailable(err) || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("after Close: %v; want ErrClosed, Unavailable", err)
	}
}

// With a Dial function, the Publisher dials through it, and dials again
// on the next call after the connection was closed under it.
func TestDialFuncAndReconnect(t *testing.T) {
	tp := newTopology(t, "#")
	var (
		mu    sync.Mutex
		conns []*amqp.Connection
	)
	pub := newPublisher(t, amqpoutbox.Config{Exchange: tp.exchange, Dial: func(ctx context.Context) (*amqp.Connection, error) {
		c, err := amqp.Dial(tp.url)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}})
	ev := func() []outbox.Event {
		return []outbox.Event{{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "a", JSON: []byte(`{}`)}, Attempt: 1}}
	}
	if err := pub.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), ev()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	conns[0].Close() // gone under the Publisher's feet
	mu.Unlock()
	if err := pub.Publish(context.Background(), ev()); err != nil {
		t.Fatalf("after the connection closed: %v; want a new connection", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 2 {
		t.Errorf("%d dials; want 2", len(conns))
	}
	if n := tp.count(t); n != 2 {
		t.Errorf("%d messages; want 2", n)
	}
}
