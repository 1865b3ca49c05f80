package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// callCounter counts handler calls per event id.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *callCounter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// waitFor polls cond until it holds or the test's wait runs out; it is
// for conditions on the database, which has no signal to wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

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

// Dead letters are per subscription: ListDead names the subscription that
// gave up, and Replay runs only it again.
func testDeadPerSubscription(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	var good, bad callCounter
	var fixed atomic.Bool
	dead := make(chan string, 1)
	replayed := make(chan string, 1)
	ob.Handle("good", func(_ context.Context, ev outbox.Event) error { good.add(ev.ID); return nil }, typeA)
	ob.Handle("bad", func(_ context.Context, ev outbox.Event) error {
		if bad.add(ev.ID) == 1 {
			defer func() { dead <- ev.ID }()
			return outbox.Permanent(errors.New("schema mismatch"))
		}
		if fixed.Load() {
			replayed <- ev.ID
		}
		return nil
	}, typeA)
	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, dead, "the bad subscription's failure")
	waitFor(t, "the dead delivery", func() bool {
		rec := e.inspect(t, id)
		return len(rec.Deliveries) == 1 && rec.Deliveries[0].Status == outbox.StatusDead
	})
	dls, err := e.store.(driver.DeadLetterStore).ListDead(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].ID != id || dls[0].Subscription != "bad" || dls[0].LastError != "schema mismatch" || dls[0].Attempts != 1 {
		t.Fatalf("ListDead = %+v; want the bad subscription's delivery of %s", dls, id)
	}
	fixed.Store(true)
	if n, err := e.store.(driver.DeadLetterStore).Replay(context.Background(), []string{id}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v; want 1", n, err)
	}
	if got := recv(t, replayed, "the replayed delivery"); got != id {
		t.Fatalf("replayed %s; want %s", got, id)
	}
	waitFor(t, "the event DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	closeNow(t, ob)
	if g := good.get(id); g != 1 {
		t.Fatalf("the good subscription ran %d times; want 1 (replay never re-runs it)", g)
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

// Lag per subscription, dead letters by filter, and replay by filter
// (dry run first, publish order, idempotent).
func testLagAndDeadFilters(t *testing.T, e *env) {
	if _, ok := e.store.(driver.OperatorStore); !ok {
		t.Skip("the store does not implement driver.OperatorStore")
	}
	ctx := context.Background()
	cfg := fastConfig()
	cfg.Workers = 1 // one at a time, so that the replay's order is visible
	ob := e.outbox(t, cfg)
	var ok1 callCounter
	var accept atomic.Bool
	replayed := make(chan string, 10)
	ob.Handle("ok", func(_ context.Context, ev outbox.Event) error { ok1.add(ev.ID); return nil }, typeA)
	ob.Handle("picky", func(_ context.Context, ev outbox.Event) error {
		if strings.Contains(string(ev.JSON), "bad") {
			if !accept.Load() {
				return outbox.Permanent(fmt.Errorf("refused: %s", ev.JSON))
			}
			replayed <- ev.ID
		}
		return nil
	}, typeA, typeB)
	ob.Handle("paused", func(context.Context, outbox.Event) error { return nil }, typeB)
	start(t, ob)
	if err := ob.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Add(-time.Minute)
	var good, bad, bs []string
	for i := range 3 {
		good = append(good, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(fmt.Sprintf(`{"n":%d}`, i))}))
	}
	for i := range 2 {
		bad = append(bad, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(fmt.Sprintf(`{"bad":%d}`, i))}))
	}
	for i := range 2 {
		bs = append(bs, e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(fmt.Sprintf(`{"b":%d}`, i))}))
	}
	lagOf := func(name string) outbox.Lag {
		lags, err := ob.Lag(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lags {
			if l.Subscription == name {
				return l
			}
		}
		t.Fatalf("no lag for %q in %+v", name, lags)
		return outbox.Lag{}
	}
	waitFor(t, "two dead deliveries and two paused", func() bool {
		return lagOf("picky").Dead == 2 && lagOf("paused").Pending == 2
	})
	for _, id := range good {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	}
	// The dead deliveries of split events count as dead letters: the
	// headline of outboxctl stats and the admin page (issue 37, item 12).
	if st, err := ob.Stats(ctx); err != nil || st.Dead != 0 || st.DeadDeliveries != 2 || st.DeadLetters() != 2 {
		t.Fatalf("Stats = %+v, %v; want 2 dead deliveries, 2 dead letters, no event dead as a whole", st, err)
	}
	if l := lagOf("ok"); l.Pending != 0 || l.Dead != 0 || l.Retrying != 0 {
		t.Fatalf("lag of ok = %+v; want nothing", l)
	}
	if l := lagOf("paused"); l.Oldest <= 0 {
		t.Fatalf("lag of paused = %+v; want an oldest age", l)
	}
	for _, tc := range []struct {
		f    outbox.DeadFilter
		want []string
	}{
		{outbox.DeadFilter{Subscription: "picky"}, bad},
		{outbox.DeadFilter{ErrorContains: "refused"}, bad},
		{outbox.DeadFilter{ErrorContains: `"bad":1`}, bad[1:]},
		{outbox.DeadFilter{ErrorContains: "100%_"}, nil},
		{outbox.DeadFilter{Subscription: "ok"}, nil},
		{outbox.DeadFilter{Type: string(typeB)}, nil},
		{outbox.DeadFilter{Type: string(typeA), Since: before, Until: time.Now().Add(time.Minute)}, bad},
		{outbox.DeadFilter{Since: time.Now().Add(time.Hour)}, nil},
		{outbox.DeadFilter{Limit: 1}, bad[:1]},
		{outbox.DeadFilter{After: bad[0]}, bad[1:]},
		{outbox.DeadFilter{IDs: []string{bad[1], good[0]}}, bad[1:]},
		{outbox.DeadFilter{Subscription: "picky", IDs: []string{bad[0]}}, bad[:1]},
	} {
		dls, err := ob.Dead(ctx, tc.f) // the Outbox's operator API over FindDead
		if err != nil {
			t.Fatalf("FindDead(%+v): %v", tc.f, err)
		}
		var got []string
		for _, dl := range dls {
			got = append(got, dl.ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("FindDead(%+v) = %v; want %v", tc.f, got, tc.want)
		}
	}
	if n, err := ob.Replay(ctx, outbox.DeadFilter{Subscription: "picky"}, true); err != nil || n != 2 {
		t.Fatalf("dry run = %d, %v; want 2", n, err)
	}
	if n, err := ob.Replay(ctx, outbox.DeadFilter{IDs: bad[1:]}, true); err != nil || n != 1 {
		t.Fatalf("dry run by id = %d, %v; want 1", n, err)
	}
	if _, err := ob.Replay(ctx, outbox.DeadFilter{IDs: make([]string, outbox.MaxFilterIDs+1)}, true); err == nil {
		t.Fatalf("a filter of %d ids was taken; want an error naming the limit", outbox.MaxFilterIDs+1)
	}
	if l := lagOf("picky"); l.Dead != 2 {
		t.Fatalf("after a dry run: %+v; want still 2 dead", l)
	}
	accept.Store(true)
	if n, err := ob.Replay(ctx, outbox.DeadFilter{Subscription: "picky"}, false); err != nil || n != 2 {
		t.Fatalf("replay = %d, %v; want 2", n, err)
	}
	if n, err := ob.Replay(ctx, outbox.DeadFilter{Subscription: "picky"}, false); err != nil || n != 0 {
		t.Fatalf("second replay = %d, %v; want 0 (nothing dead now)", n, err)
	}
	for i, want := range bad {
		if got := recv(t, replayed, "a replayed delivery"); got != want {
			t.Fatalf("replayed delivery %d is %s; want %s (publish order)", i, got, want)
		}
	}
	for _, id := range append(good, bad...) {
		waitFor(t, "event "+id+" DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
		if n := ok1.get(id); n != 1 {
			t.Fatalf("ok ran %d times for %s; want 1", n, id)
		}
	}
	rec, err := ob.Inspect(ctx, bad[0])
	if err != nil || rec.ID != bad[0] || rec.Status != outbox.StatusDone {
		t.Fatalf("Inspect(%s) = %+v, %v; want the DONE event", bad[0], rec.Row, err)
	}
	if _, err := ob.Inspect(ctx, "no-such-event"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Inspect(unknown) = %v; want ErrNotFound", err)
	}
	if st, err := ob.Stats(ctx); err != nil || st.DeadLetters() != 0 || st.Pending() != 0 {
		t.Fatalf("Stats = %+v, %v; want nothing pending or dead", st, err)
	}
	closeNow(t, ob)
	select {
	case id := <-replayed:
		t.Fatalf("%s replayed twice", id)
	default:
	}
}
