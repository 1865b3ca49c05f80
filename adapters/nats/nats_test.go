package natsoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A committed event is one message on its subject: Nats-Msg-Id and
// txoutbox-id are the event id, every meta header is there in order (a
// user header and traceparent included), and the body is the payload.
func TestCommitPublishesOneMessage(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, nil)
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{tenant}.{type}"})
	if err != nil {
		t.Fatal(err)
	}
	e := newOutbox(t, outbox.Config{})
	if err := pub.Subscribe(context.Background(), e.ob, outbox.Subscription{Name: "to-nats"}); err != nil {
		t.Fatal(err)
	}
	e.start(t)

	at := time.Date(2026, 3, 4, 5, 6, 7, 890123000, time.UTC) // the store keeps microseconds
	payload := []byte(`{"id":42,"item":"book","note":"caf\u00e9 \u2713"}`)
	ids := e.publish(t, true, outbox.Envelope{
		Type: "order.created", AggregateType: "order", AggregateID: "42", TenantID: "acme.eu",
		OccurredAt: at, JSON: payload,
		Headers: map[string]string{"x-user": "u1", "traceparent": traceparent, "tracestate": "k=v"},
	})
	ts.waitCount(t, 1, 10*time.Second)
	msgs := ts.msgs(t)
	m := msgs[0]
	if want := ts.prefix + ".acme_eu.order.created"; m.Subject != want {
		t.Errorf("subject %q, want %q", m.Subject, want)
	}
	if got := m.Header.Get(jetstream.MsgIDHeader); got != ids[0] {
		t.Errorf("Nats-Msg-Id %q, want the event id %q", got, ids[0])
	}
	if !bytes.Equal(m.Data, payload) {
		t.Errorf("body %q, want %q", m.Data, payload)
	}
	want := map[string]string{
		meta.ID: ids[0], meta.Type: "order.created", meta.AggregateType: "order", meta.AggregateID: "42",
		meta.TenantID: "acme.eu", meta.OccurredAt: "2026-03-04T05:06:07.890123Z", meta.ContentType: "application/json",
		"x-user": "u1", "traceparent": traceparent, "tracestate": "k=v", jetstream.MsgIDHeader: ids[0],
	}
	for k, v := range want {
		if got := m.Header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if len(m.Header) != len(want) {
		t.Errorf("headers %v, want exactly %v", m.Header, want)
	}
	// A Go consumer rebuilds the envelope from the headers (leaving out
	// NATS's own).
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	got, err := meta.Envelope(m.Header.Get, keys, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ids[0] || !got.OccurredAt.Equal(at) || got.TenantID != "acme.eu" || !maps.Equal(got.Headers, map[string]string{"x-user": "u1", "traceparent": traceparent, "tracestate": "k=v"}) {
		t.Errorf("meta.Envelope: %+v", got)
	}
	if d := e.waitDelivery(t, ids[0], "to-nats", 5*time.Second); d.Status != outbox.StatusDone || d.Attempts != 0 {
		t.Errorf("delivery %+v, want DONE at the first attempt", d)
	}
}

// A rolled-back event never reaches the broker: after a committed marker
// event arrives, the stream holds the marker alone.
func TestRollbackPublishesNothing(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, nil)
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	e := newOutbox(t, outbox.Config{})
	if err := pub.Subscribe(context.Background(), e.ob, outbox.Subscription{Name: "to-nats"}); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	e.publish(t, false, outbox.Envelope{Type: "rolled.back", JSON: jsonPayload(1)})
	marker := e.publish(t, true, outbox.Envelope{Type: "marker", JSON: jsonPayload(2)})
	e.waitDelivery(t, marker[0], "to-nats", 10*time.Second)
	msgs := ts.msgs(t)
	if len(msgs) != 1 || msgs[0].Header.Get(meta.ID) != marker[0] {
		t.Fatalf("stream holds %d messages (%v), want the marker alone", len(msgs), msgs)
	}
}

// An event published again, as after a crash before the outbox recorded
// its delivery, is stored once: the handler's first call succeeds on the
// broker but the engine sees a failure (the lost DONE write), so it
// publishes the batch again with the same ids.
func TestRedeliveryStoredOnce(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, nil)
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	crashOnce := func(ctx context.Context, evs []outbox.Event) error {
		if err := pub.Handler()(ctx, evs); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("simulated crash before the DONE write")
		}
		return nil
	}
	e := newOutbox(t, outbox.Config{Retry: outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond })})
	if err := e.ob.Subscribe(outbox.Subscription{Name: "to-nats", Batch: crashOnce, BatchLinger: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	ids := e.publish(t, true,
		outbox.Envelope{Type: "a", JSON: jsonPayload(1)},
		outbox.Envelope{Type: "b", JSON: jsonPayload(2)},
		outbox.Envelope{Type: "c", JSON: jsonPayload(3)})
	for _, id := range ids {
		if d := e.waitDelivery(t, id, "to-nats", 10*time.Second); d.Status != outbox.StatusDone {
			t.Fatalf("event %s: %+v", id, d)
		}
	}
	if calls.Load() < 2 {
		t.Fatalf("handler called %d times, want the batch published twice", calls.Load())
	}
	msgs := ts.msgs(t)
	var got []string
	for _, m := range msgs {
		got = append(got, m.Header.Get(jetstream.MsgIDHeader))
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(ids))
	if !slices.Equal(got, want) {
		t.Fatalf("stream holds %v, want each event once: %v", got, want)
	}

	// The same, called directly: the second publish is acknowledged (as a
	// duplicate) and stores nothing.
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "direct", JSON: jsonPayload(9)}}
	for range 2 {
		if err := pub.Publish(context.Background(), []outbox.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	ts.waitCount(t, uint64(len(ids)+1), 5*time.Second)
}

// An event bigger than the server's max_payload is DEAD at its first
// attempt, before it is sent; one bigger than the stream's max_msg_size is
// DEAD at its first attempt on the server's answer.
func TestOversizedPayloadIsDead(t *testing.T) {
	nc, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	e := newOutbox(t, outbox.Config{})
	if err := pub.Subscribe(context.Background(), e.ob, outbox.Subscription{Name: "to-nats"}); err != nil {
		t.Fatal(err)
	}
	e.start(t)

	overStream := e.publish(t, true, outbox.Envelope{Type: "big", Bytes: bytes.Repeat([]byte{'x'}, 8192)})[0]
	d := e.waitDelivery(t, overStream, "to-nats", 10*time.Second)
	if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "max_msg_size") {
		t.Errorf("over max_msg_size: %+v, want DEAD at the first attempt, saying max_msg_size", d)
	}
	t.Logf("over max_msg_size: %s", d.LastError)

	maxPayload := nc.MaxPayload()
	if maxPayload > outbox.MaxPayloadBytes {
		t.Logf("server max_payload %d is above the outbox's payload limit: max_payload case not testable here", maxPayload)
	} else {
		// The largest payload the outbox takes, plus the headers, is over
		// a max_payload of at most 1 MiB.
		overServer := e.publish(t, true, outbox.Envelope{Type: "huge", Bytes: bytes.Repeat([]byte{'y'}, outbox.MaxPayloadBytes)})[0]
		d := e.waitDelivery(t, overServer, "to-nats", 10*time.Second)
		if d.Status != outbox.StatusDead || d.Attempts != 1 || !strings.Contains(d.LastError, "max_payload") {
			t.Errorf("over max_payload: %+v, want DEAD at the first attempt, saying max_payload", d)
		}
		t.Logf("over max_payload: %s", d.LastError)
	}
	if n := ts.count(t); n != 0 {
		t.Errorf("stream holds %d messages, want none", n)
	}
}

// A batch gets an outcome per event: the one event the stream refuses
// fails (permanently), the others are stored; an event whose subject no
// stream takes is Unavailable.
func TestBatchOutcomePerEvent(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgSize = 4096 })
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]outbox.Event, 20)
	for i := range evs {
		evs[i] = outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "ok", JSON: jsonPayload(i)}}
	}
	const bad = 7
	evs[bad].JSON = nil
	evs[bad].Bytes = bytes.Repeat([]byte{'z'}, 8192)

	err = pub.Handler()(context.Background(), evs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(evs) {
		t.Fatalf("got %v, want a *outbox.BatchError with %d outcomes", err, len(evs))
	}
	for i, err := range be.Errs {
		switch {
		case i == bad && (err == nil || outbox.DefaultClassifier(err) != outbox.DecisionDead):
			t.Errorf("event %d: %v, want a permanent error", i, err)
		case i != bad && err != nil:
			t.Errorf("event %d: %v, want delivered", i, err)
		}
	}
	ts.waitCount(t, uint64(len(evs)-1), 5*time.Second)

	// A subject that no stream takes: no responders, an outage.
	other, err := natsoutbox.New(js, natsoutbox.Config{Subject: "txo-nostream-" + strings.ToLower(outbox.NewID()) + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	err = other.Publish(context.Background(), evs[:1])
	if !errors.As(err, &be) || len(be.Errs) != 1 {
		t.Fatalf("no stream: got %v", err)
	}
	if down, _ := outbox.IsUnavailable(be.Errs[0]); !down {
		t.Errorf("no stream: %v, want outbox.Unavailable", be.Errs[0])
	}
}

// OUTAGE: while a steady stream of events is published, the connection to
// NATS is cut (through a proxy) and restored. Every event arrives, once,
// none is DEAD, and no attempt is spent: the connector reports the outage
// as outbox.Unavailable.
func TestOutageLosesNothing(t *testing.T) {
	url := testbroker.NATS(t)
	hp, err := testbroker.HostPort(url)
	if err != nil {
		t.Fatal(err)
	}
	_, adminJS := connect(t, url)
	ts := newStream(t, adminJS, nil)
	proxy := testbroker.NewProxy(t, hp)
	nc, js := connect(t, testbroker.WithHost(url, proxy.Addr()))
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	e := newOutbox(t, outbox.Config{})
	// Count the outages the handler reports, to show that the cut was
	// seen and reported as such.
	var outages atomic.Int32
	h := pub.Handler()
	sub := outbox.Subscription{
		Name: "to-nats",
		Batch: func(ctx context.Context, evs []outbox.Event) error {
			err := h(ctx, evs)
			var be *outbox.BatchError
			if errors.As(err, &be) {
				for _, err := range be.Errs {
					if down, _ := outbox.IsUnavailable(err); down {
						outages.Add(1)
					}
				}
			} else if down, _ := outbox.IsUnavailable(err); down {
				outages.Add(int32(len(evs)))
			}
			return err
		},
		Timeout:         time.Second,
		CircuitProbe:    100 * time.Millisecond,
		CircuitMaxProbe: 200 * time.Millisecond,
	}
	if err := pub.Check(context.Background(), sub, e.ob.Config()); err != nil {
		t.Fatal(err)
	}
	if err := e.ob.Subscribe(sub); err != nil {
		t.Fatal(err)
	}
	e.start(t)

	const total, cutAt, restoreAt = 300, 80, 200
	var ids []string
	for i := range total {
		switch i {
		case cutAt:
			proxy.Cut()
			waitFor(t, "the client to see the cut", func() bool { return !nc.IsConnected() })
		case restoreAt:
			proxy.Restore()
		}
		ids = append(ids, e.publish(t, true, outbox.Envelope{Type: "tick", JSON: jsonPayload(i)})...)
		time.Sleep(3 * time.Millisecond) // a steady stream, not a burst
	}
	ts.waitCount(t, total, 30*time.Second)
	msgs := ts.msgs(t)
	seen := map[string]bool{}
	for _, m := range msgs {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if seen[id] {
			t.Errorf("event %s stored twice", id)
		}
		seen[id] = true
	}
	dead, spent := 0, 0
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("event %s lost", id)
		}
		d := e.waitDelivery(t, id, "to-nats", 10*time.Second)
		if d.Status == outbox.StatusDead {
			dead++
		}
		spent += d.Attempts
	}
	if dead != 0 || spent != 0 {
		t.Errorf("%d events DEAD, %d attempts spent; want 0 and 0", dead, spent)
	}
	if outages.Load() == 0 {
		t.Errorf("the handler reported no outage: the cut was not seen")
	}
	t.Logf("%d events, %d stored, %d event deliveries reported Unavailable, reconnects: %d", total, len(msgs), outages.Load(), nc.Stats().Reconnects)
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A connection cut while a batch waits for its acknowledgements fails the
// unacknowledged events as outbox.Unavailable (never as a failure that
// spends attempts, never as permanent); publishing them again after the
// restore stores each event once, including those that reached the stream
// before the cut without their acknowledgement coming back.
func TestCutMidBatchIsUnavailable(t *testing.T) {
	url := testbroker.NATS(t)
	hp, err := testbroker.HostPort(url)
	if err != nil {
		t.Fatal(err)
	}
	_, adminJS := connect(t, url)
	ts := newStream(t, adminJS, nil)
	proxy := testbroker.NewProxy(t, hp)
	nc, js := connect(t, testbroker.WithHost(url, proxy.Addr()))
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]outbox.Event, 3000)
	for i := range evs {
		evs[i] = outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "mid", JSON: jsonPayload(i)}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(ctx, evs) }()
	waitFor(t, "the first messages in the stream", func() bool { return ts.count(t) > 0 })
	proxy.Cut()
	err = <-done

	var retry []outbox.Event
	var be *outbox.BatchError
	switch {
	case err == nil:
		t.Log("the whole batch was acknowledged before the cut")
	case errors.As(err, &be):
		for i, err := range be.Errs {
			if err == nil {
				continue
			}
			if down, _ := outbox.IsUnavailable(err); !down {
				t.Fatalf("event %d: %v, want outbox.Unavailable", i, err)
			}
			retry = append(retry, evs[i])
		}
	default:
		if down, _ := outbox.IsUnavailable(err); !down {
			t.Fatalf("%v, want outbox.Unavailable", err)
		}
		retry = evs
	}
	stored := ts.count(t)
	t.Logf("at the cut: %d stored, %d to publish again", stored, len(retry))

	proxy.Restore()
	waitFor(t, "the reconnection", nc.IsConnected)
	for len(retry) > 0 {
		err := pub.Publish(context.Background(), retry)
		if err == nil {
			break
		}
		if !errors.As(err, &be) {
			t.Fatalf("after the restore: %v", err)
		}
		var again []outbox.Event
		for i, err := range be.Errs {
			if err != nil {
				if down, _ := outbox.IsUnavailable(err); !down {
					t.Fatalf("after the restore: %v", err)
				}
				again = append(again, retry[i])
			}
		}
		retry = again
	}
	ts.waitCount(t, uint64(len(evs)), 10*time.Second)
}

// A stream that cannot store more (MaxMsgs with DiscardNew: error 503) is
// an outage of the destination, not a fault of the event.
func TestFullStreamIsUnavailable(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	ts := newStream(t, js, func(c *jetstream.StreamConfig) { c.MaxMsgs = 1; c.Discard = jetstream.DiscardNew })
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		t.Fatal(err)
	}
	evs := []outbox.Event{
		{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "a", JSON: jsonPayload(1)}},
		{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "a", JSON: jsonPayload(2)}},
	}
	var be *outbox.BatchError
	if err := pub.Publish(context.Background(), evs); !errors.As(err, &be) || be.Errs[0] != nil || be.Errs[1] == nil {
		t.Fatalf("%v, want the second event refused", err)
	}
	if down, _ := outbox.IsUnavailable(be.Errs[1]); !down {
		t.Errorf("%v, want outbox.Unavailable", be.Errs[1])
	}
}
