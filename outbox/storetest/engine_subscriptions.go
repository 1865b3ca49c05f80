package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// Engine cases: subscriptions.

// One subscription fails, the other does not: only the failing one is
// called again, and the event is DONE once it succeeds.
func testSubscriptionsFailAlone(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	var good, flaky callCounter
	const n = 20
	doneFlaky := newRecorder(n)
	ob.Handle("good", func(_ context.Context, ev outbox.Event) error { good.add(ev.ID); return nil }, typeA)
	ob.Handle("flaky", func(ctx context.Context, ev outbox.Event) error {
		if flaky.add(ev.ID) == 1 {
			return errors.New("flaky: first attempt fails")
		}
		if ev.Attempt != 2 || ev.Subscription != "flaky" {
			t.Errorf("flaky got attempt %d for subscription %q; want 2, flaky", ev.Attempt, ev.Subscription)
		}
		return doneFlaky.listen(ctx, ev)
	}, typeA)
	start(t, ob)
	ids := e.publishMany(t, ob, typeA, n)
	doneFlaky.wait(t, wait)
	for _, id := range ids {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	closeNow(t, ob)
	for _, id := range ids {
		if g, f := good.get(id), flaky.get(id); g != 1 || f != 2 {
			t.Errorf("event %s: good called %d times, flaky %d; want 1 and 2", id, g, f)
		}
		rec := e.inspect(t, id)
		if len(rec.Deliveries) != 1 || rec.Deliveries[0].Subscription != "flaky" || rec.Deliveries[0].Status != outbox.StatusDone || rec.Deliveries[0].Attempts != 1 {
			t.Errorf("event %s deliveries %+v; want flaky DONE after 1 failed attempt", id, rec.Deliveries)
			continue
		}
		if h := rec.Deliveries[0].History; len(h) != 1 || h[0].N != 1 || h[0].Error != "flaky: first attempt fails" || h[0].At.IsZero() {
			t.Errorf("event %s: history %+v; want the first attempt's failure", id, h)
		}
	}
}

// A subscription only another instance runs is owed its events: an
// instance delivers to its own subscriptions and leaves the rest to the
// instance that has them; each subscription gets each event once. So is
// one that takes every type (registered with none).
func testSubscriptionOwedElsewhere(t *testing.T, e *env) {
	const n = 20
	var oldA, newA, newB, newAll callCounter
	recB, recAll := newRecorder(n), newRecorder(n)
	// The new version (subscriptions a, b and all) starts first and
	// registers them; the old one (only a) publishes.
	newer := e.outbox(t, fastConfig())
	newer.Handle("a", func(_ context.Context, ev outbox.Event) error { newA.add(ev.ID); return nil }, typeA)
	newer.Handle("b", func(ctx context.Context, ev outbox.Event) error { newB.add(ev.ID); return recB.listen(ctx, ev) }, typeA)
	newer.Handle("all", func(ctx context.Context, ev outbox.Event) error { newAll.add(ev.ID); return recAll.listen(ctx, ev) })
	start(t, newer)
	older := e.outbox(t, fastConfig())
	older.Handle("a", func(_ context.Context, ev outbox.Event) error { oldA.add(ev.ID); return nil }, typeA)
	start(t, older)
	ids := e.publishMany(t, older, typeA, n)
	recB.wait(t, wait)
	recAll.wait(t, wait)
	for _, id := range ids {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	closeNow(t, older)
	closeNow(t, newer)
	for _, id := range ids {
		if a, b, all := oldA.get(id)+newA.get(id), newB.get(id), newAll.get(id); a != 1 || b != 1 || all != 1 {
			t.Errorf("event %s: a delivered %d times, b %d, all %d; want once each", id, a, b, all)
		}
	}
}

// A paused subscription takes nothing on any instance and spends no
// attempts; the others flow; after Resume it gets everything.
func testPauseResume(t *testing.T, e *env) {
	const n = 10
	cfg := fastConfig()
	a := e.outbox(t, cfg)
	other := e.outbox(t, cfg)
	var aCalls, otherCalls atomic.Int64
	flowing := newRecorder(n)
	resumed := newRecorder(n)
	for i, ob := range []*outbox.Outbox{a, other} {
		calls := []*atomic.Int64{&aCalls, &otherCalls}[i]
		ob.Handle("flowing", flowing.listen, typeA)
		ob.Handle("paused", func(ctx context.Context, ev outbox.Event) error {
			calls.Add(1)
			if ev.Attempt != 1 {
				t.Errorf("paused subscription got attempt %d; want 1", ev.Attempt)
			}
			return resumed.listen(ctx, ev)
		}, typeA)
		start(t, ob)
	}
	if err := a.Pause(context.Background(), "paused"); err != nil {
		t.Fatal(err)
	}
	if err := a.Pause(context.Background(), "no-such"); err == nil {
		t.Fatal("Pause of an unknown subscription succeeded")
	}
	// The other instance learns it within its PollInterval.
	waitFor(t, "the other instance to see the pause", func() bool { return pausedSeen(other) })
	ids := e.publishMany(t, a, typeA, n/2)
	ids = append(ids, e.publishMany(t, other, typeA, n/2)...)
	flowing.wait(t, wait)
	if c := aCalls.Load() + otherCalls.Load(); c != 0 {
		t.Fatalf("the paused subscription was called %d times", c)
	}
	for _, id := range ids {
		waitFor(t, "event "+id+" split", func() bool { return e.inspect(t, id).Status == outbox.StatusSplit })
		rec := e.inspect(t, id)
		if len(rec.Deliveries) != 1 || rec.Deliveries[0].Subscription != "paused" || rec.Deliveries[0].Status != outbox.StatusNew || rec.Deliveries[0].Attempts != 0 {
			t.Fatalf("event %s while paused: %+v; want the paused delivery NEW with 0 attempts", id, rec.Deliveries)
		}
	}
	if c := aCalls.Load() + otherCalls.Load(); c != 0 {
		t.Fatalf("the paused subscription was called %d times", c)
	}
	if err := other.Resume(context.Background(), "paused"); err != nil {
		t.Fatal(err)
	}
	resumed.wait(t, wait)
	for _, id := range ids {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	closeNow(t, a)
	closeNow(t, other)
}

// pausedSeen reports whether ob's registry knows "paused" is paused.
func pausedSeen(ob *outbox.Outbox) bool {
	for _, s := range ob.Subscriptions() {
		if s.Name == "paused" {
			return s.Paused
		}
	}
	return false
}

// A destination that is unavailable costs no attempts: with MaxAttempts 2
// and the destination down for many tries, nothing goes DEAD, and every
// event is delivered once it is back, at its first counted attempt.
func testUnavailableCostsNoAttempts(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.MaxAttempts = 2
	ob := e.outbox(t, cfg)
	const n = 10
	var down atomic.Bool
	down.Store(true)
	var refused atomic.Int64
	rec := newRecorder(n)
	opened := make(chan struct{})
	var once sync.Once
	if err := ob.Subscribe(outbox.Subscription{
		Name: "webhook", Types: []outbox.EventType{typeA},
		CircuitThreshold: 3, CircuitProbe: 20 * time.Millisecond, CircuitMaxProbe: 40 * time.Millisecond,
		Handler: func(ctx context.Context, ev outbox.Event) error {
			if down.Load() {
				if refused.Add(1) >= 3 {
					once.Do(func() { close(opened) })
				}
				return outbox.Unavailable(errors.New("503 from the webhook"), 0)
			}
			if ev.Attempt != 1 {
				t.Errorf("event %s delivered at attempt %d; want 1 (outages spend none)", ev.ID, ev.Attempt)
			}
			return rec.listen(ctx, ev)
		},
	}); err != nil {
		t.Fatal(err)
	}
	start(t, ob)
	ids := e.publishMany(t, ob, typeA, n)
	recv(t, opened, "the circuit to open")
	waitFor(t, "the circuit state", func() bool { return ob.CircuitStates()["webhook"] != outbox.CircuitClosed })
	// Let a few probes fail.
	for refused.Load() < n+5 {
		time.Sleep(5 * time.Millisecond)
	}
	for _, id := range ids {
		if st := e.inspect(t, id).Status; st == outbox.StatusDead {
			t.Fatalf("event %s DEAD during an outage", id)
		}
	}
	down.Store(false)
	rec.wait(t, wait)
	if st := ob.CircuitStates()["webhook"]; st != outbox.CircuitClosed {
		t.Fatalf("circuit %s after the destination came back; want closed", st)
	}
	for _, id := range ids {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	closeNow(t, ob)
}

// A batch subscription gets events in batches and may fail some of them:
// only those are retried.
func testBatchSubscription(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	const n = 50
	var mu sync.Mutex
	calls, maxBatch := 0, 0
	seen := map[string]int{}
	rec := newRecorder(n)
	if err := ob.Subscribe(outbox.Subscription{
		Name: "bulk", Types: []outbox.EventType{typeA}, BatchSize: 20, BatchLinger: 20 * time.Millisecond,
		Batch: func(ctx context.Context, evs []outbox.Event) error {
			mu.Lock()
			calls++
			maxBatch = max(maxBatch, len(evs))
			errs := make([]error, len(evs))
			failed := false
			for i, ev := range evs {
				seen[ev.ID]++
				if seen[ev.ID] == 1 && i%2 == 1 {
					errs[i], failed = fmt.Errorf("item %d refused", i), true
				}
			}
			mu.Unlock()
			for i, ev := range evs {
				if errs[i] == nil {
					rec.listen(ctx, ev)
				}
			}
			if failed {
				return &outbox.BatchError{Errs: errs}
			}
			return nil
		},
	}); err != nil {
		t.Fatal(err)
	}
	start(t, ob)
	ids := e.publishMany(t, ob, typeA, n)
	rec.wait(t, wait)
	for _, id := range ids {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	closeNow(t, ob)
	mu.Lock()
	defer mu.Unlock()
	if maxBatch < 2 || maxBatch > 20 {
		t.Errorf("largest batch %d; want between 2 and BatchSize 20", maxBatch)
	}
	if calls >= n {
		t.Errorf("%d calls for %d events; want batches", calls, n)
	}
	for _, id := range ids {
		if seen[id] > 2 {
			t.Errorf("event %s sent %d times; want at most 2 (once more only if it failed)", id, seen[id])
		}
	}
}

// Subscribe validates names and options and refuses after Start.
func testSubscribeValidation(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	h := func(context.Context, outbox.Event) error { return nil }
	for _, s := range []outbox.Subscription{
		{Name: "", Handler: h},
		{Name: "has space", Handler: h},
		{Name: "-leading", Handler: h},
		{Name: string(make([]byte, 101)), Handler: h},
		{Name: "none"},
		{Name: "both", Handler: h, Batch: func(context.Context, []outbox.Event) error { return nil }},
		{Name: "neg", Handler: h, MaxAttempts: -1},
	} {
		if err := ob.Subscribe(s); err == nil {
			t.Errorf("Subscribe(%q) succeeded; want an error", s.Name)
		}
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "ok.name_1-x", Handler: h}); err != nil {
		t.Fatal(err)
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "ok.name_1-x", Handler: h}); err == nil {
		t.Fatal("a repeated name was accepted")
	}
	start(t, ob)
	if err := ob.Subscribe(outbox.Subscription{Name: "late", Handler: h}); !errors.Is(err, outbox.ErrStarted) {
		t.Fatalf("Subscribe after Start = %v; want ErrStarted", err)
	}
	closeNow(t, ob)
}
