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

// Engine cases: the operator's API (DeliverOne, Drain, Lag, Dead,
// Replay) and retention.

// DeliverOne takes exactly one due event and returns once its outcome is
// recorded; Drain takes the rest and returns once nothing is due; both
// refuse an outbox that is not started.
func testDeliverOneAndDrain(t *testing.T, e *env) {
	ctx := context.Background()
	cfg := fastConfig()
	cfg.DisableHotPath = true // everything waits in the table
	cfg.DisablePoller = true  // only DeliverOne and Drain take it
	ob := e.outbox(t, cfg)
	var mu sync.Mutex
	seen := map[string]int{}
	ob.Handle("count", func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		seen[ev.ID]++
		mu.Unlock()
		return nil
	}, typeA)
	if _, err := ob.DeliverOne(ctx); err == nil {
		t.Fatal("DeliverOne before Start succeeded; want an error saying to start")
	}
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte{'0' + byte(i)}}))
	}
	ok, err := ob.DeliverOne(ctx)
	if err != nil || !ok {
		t.Fatalf("DeliverOne = %v, %v; want one delivered", ok, err)
	}
	done := 0
	for _, id := range ids {
		if e.inspect(t, id).Status == outbox.StatusDone {
			done++
		}
	}
	mu.Lock()
	calls := len(seen)
	mu.Unlock()
	if done != 1 || calls != 1 {
		t.Fatalf("after DeliverOne: %d DONE, %d handled; want 1 and 1 (recorded before it returns)", done, calls)
	}
	n, err := ob.Drain(ctx)
	if err != nil || n != 4 {
		t.Fatalf("Drain = %d, %v; want the 4 left", n, err)
	}
	for _, id := range ids {
		if st := e.inspect(t, id).Status; st != outbox.StatusDone {
			t.Fatalf("event %s is %v after Drain; want DONE", id, st)
		}
		mu.Lock()
		c := seen[id]
		mu.Unlock()
		if c != 1 {
			t.Fatalf("event %s handled %d times; want 1", id, c)
		}
	}
	if ok, err := ob.DeliverOne(ctx); err != nil || ok {
		t.Fatalf("DeliverOne on an empty table = %v, %v; want nothing", ok, err)
	}
	if n, err := ob.Drain(ctx); err != nil || n != 0 {
		t.Fatalf("second Drain = %d, %v; want 0", n, err)
	}
}

// subscriptionLag returns ob's Lag of the subscription name.
func subscriptionLag(t *testing.T, ob *outbox.Outbox, name string) outbox.Lag {
	t.Helper()
	lags, err := ob.Lag(context.Background())
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

// Lag's Oldest is the age of the oldest event a subscription has not
// delivered, counted from the event's publication: an event deferred for
// a paused subscription is not younger for having been split later. (It
// was counted from the split, and a split written between Lag's clock
// reading and its scan showed an age of 0 for a pending event.)
func testLagAgesFromPublication(t *testing.T, e *env) {
	if _, ok := e.store.(driver.OperatorStore); !ok {
		t.Skip("the store does not implement driver.OperatorStore")
	}
	ctx := context.Background()
	cfg := fastConfig()
	cfg.Workers = 1
	ob := e.outbox(t, cfg)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	ob.Handle("gate", func(context.Context, outbox.Event) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		return nil
	}, typeA)
	ob.Handle("paused", func(context.Context, outbox.Event) error { return nil }, typeA)
	start(t, ob)
	if err := ob.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(`{}`)})
	recv(t, entered, "the gate's handler to take the event")
	// The event ages before it is split: the gate holds it.
	const age = 300 * time.Millisecond
	time.Sleep(age)
	close(release)
	lagOf := func(name string) outbox.Lag { return subscriptionLag(t, ob, name) }
	waitFor(t, "the event split: delivered to gate, owed to paused", func() bool {
		return lagOf("gate").Pending == 0 && lagOf("paused").Pending == 1
	})
	if l := lagOf("paused"); l.Oldest < age {
		t.Fatalf("lag of paused = %+v; want an oldest age of at least %v, the time since the event was published", l, age)
	}
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
	lagOf := func(name string) outbox.Lag { return subscriptionLag(t, ob, name) }
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

// Config.Retention makes the engine delete old DONE rows at Start, DEAD
// rows too with CleanupDead, and never a NEW one.
func testRetention(t *testing.T, e *env) {
	if _, ok := e.store.(driver.Cleaner); !ok {
		t.Skip("store is not an driver.Cleaner")
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	ob := e.outbox(t, cfg)
	rec := newRecorder(3)
	ob.Handle("listener-14", rec.listen, typeA)
	ob.Handle("listener-15", func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("no")) }, typeB)
	start(t, ob)
	var done []string
	for range 2 {
		done = append(done, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)}))
	}
	dead := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	done = append(done, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)}))
	rec.wait(t, wait)
	closeNow(t, ob)
	e.wantStatus(t, dead, outbox.StatusDead)
	pending := e.outbox(t, outbox.Config{DisableHotPath: true})
	keep := e.publish(t, pending, outbox.Envelope{Type: typeA, JSON: []byte(payload)})

	clean := func(cleanupDead bool) {
		t.Helper()
		m := &counting{cleanedCh: make(chan int64, 10)}
		cfg := fastConfig()
		cfg.DisablePoller, cfg.DisableHotPath = true, true
		cfg.Metrics = m
		cfg.Retention = time.Millisecond // everything written before this point
		cfg.CleanupBatchSize = 2         // several batches
		cfg.CleanupDead = cleanupDead
		cleaner := e.outbox(t, cfg)
		start(t, cleaner)
		for n := int64(2); n == 2; { // a run ends with a batch that is not full
			n = recv(t, m.cleanedCh, "a cleanup batch")
		}
		closeNow(t, cleaner)
	}
	time.Sleep(5 * time.Millisecond) // let the rows age past the 1ms retention (no signal for elapsed time)
	clean(false)
	for _, id := range done {
		r, err := e.store.(driver.Inspector).Inspect(context.Background(), id)
		if e.h.ArchivesDelivered && err == nil && r.Archived() {
			continue // the archive's retention is the archive's
		}
		if !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("DONE event %s after cleanup: %v; want it deleted", id, err)
		}
	}
	e.wantStatus(t, dead, outbox.StatusDead)
	e.wantStatus(t, keep, outbox.StatusNew)
	clean(true)
	if _, err := e.store.(driver.Inspector).Inspect(context.Background(), dead); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("DEAD event after a cleanup with CleanupDead: %v; want it deleted", err)
	}
	e.wantStatus(t, keep, outbox.StatusNew)
}
