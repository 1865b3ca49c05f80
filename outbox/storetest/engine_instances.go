package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Engine cases: several instances over one table.

// Four instances polling one table deliver each of 10,000 events exactly
// once.
func testFourInstances(t *testing.T, e *env) {
	n := 10000
	if raceEnabled && !e.h.ConcurrentWriters {
		// modernc.org/sqlite is C translated to Go: the race detector
		// slows it a hundredfold. `make test` also runs the suite without
		// -race, with the full count.
		n = 2000
		t.Logf("race detector on: %d events instead of 10000 on this store", n)
	}
	producer := e.outbox(t, outbox.Config{DisableHotPath: true})
	ids := e.publishMany(t, producer, typeA, n)
	rec := newRecorder(n)
	var instances []*outbox.Outbox
	metrics := make([]*counting, 4)
	for i := range 4 {
		cfg := fastConfig()
		cfg.PollBatchSize = 200
		metrics[i] = &counting{}
		cfg.Metrics = metrics[i]
		ob := e.outbox(t, cfg)
		ob.Handle("all", rec.listen)
		instances = append(instances, ob)
	}
	for _, ob := range instances {
		start(t, ob)
	}
	rec.wait(t, 90*time.Second)
	for _, ob := range instances {
		closeNow(t, ob)
	}
	counts, _ := rec.snapshot()
	for _, id := range ids {
		if counts[id] != 1 {
			t.Fatalf("event %s delivered %d times, want exactly once", id, counts[id])
		}
	}
	busy := 0
	for _, m := range metrics {
		if m.coldEnqueued.Load() > 0 {
			busy++
		}
	}
	e.wantDelivered(t, int64(n))
	t.Logf("%d of 4 instances took part", busy)
}

// The events of an instance that died after commit are delivered by
// another once the lease runs out.
func testTakeover(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Lease = 300 * time.Millisecond
	dead := e.outbox(t, cfg) // never started: it "dies" with events in its hot queue
	dead.Handle("all", func(context.Context, outbox.Event) error { t.Error("the dead instance delivered"); return nil })
	ids := make([]string, 5)
	for i := range ids {
		ids[i] = e.publish(t, dead, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	m := &counting{}
	cfg = fastConfig()
	cfg.Metrics = m
	survivor := e.outbox(t, cfg)
	rec := newRecorder(len(ids))
	survivor.Handle("all", rec.listen)
	start(t, survivor)
	rec.wait(t, wait)
	closeNow(t, survivor)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if m.reclaimed.Load() != int64(len(ids)) {
		t.Fatalf("leases reclaimed = %d, want %d", m.reclaimed.Load(), len(ids))
	}
}

// An instance never marks DONE an event that a subscription elsewhere is
// owed: two instances with different listeners share the table (a
// rolling deploy), each event is delivered by the instance that has its
// listener, none is completed by the other. An event of a type that no
// subscription anywhere takes is completed at once, without a delivery;
// a subscription registered later is owed only what commits after.
func testNeverCompletesWithoutListener(t *testing.T, e *env) {
	var obs [2]*outbox.Outbox
	var recs [2]*recorder
	var ms [2]*counting
	types := [2]outbox.EventType{typeA, typeB}
	const rounds, perRound = 5, 10
	want := rounds * perRound / 2 // of each type, from both instances together
	for i := range obs {
		cfg := fastConfig()
		cfg.NoListenerDelay = 20 * time.Millisecond
		ms[i] = &counting{}
		cfg.Metrics = ms[i]
		obs[i] = e.outbox(t, cfg)
		recs[i] = newRecorder(want)
		rec, other := recs[i], types[1-i]
		obs[i].Handle("listener-"+string(types[i]), func(ctx context.Context, ev outbox.Event) error {
			if ev.Type == other {
				t.Errorf("instance %d got an event of type %s it has no listener for", i, ev.Type)
			}
			return rec.listen(ctx, ev)
		}, types[i])

		start(t, obs[i])
	}
	var ids [2][]string
	for r := range rounds {
		for k := range perRound {
			ob := obs[(r+k)%2] // each instance publishes both types
			typ := types[k%2]
			id := e.publish(t, ob, outbox.Envelope{Type: typ, JSON: []byte(payload)})
			ids[k%2] = append(ids[k%2], id)
		}
	}
	for i := range recs {
		recs[i].wait(t, wait)
	}
	for i := range obs {
		closeNow(t, obs[i])
	}
	for i, rec := range recs {
		counts, _ := rec.snapshot()
		for _, id := range ids[i] {
			if counts[id] == 0 {
				t.Errorf("event %s of type %s never delivered", id, types[i])
			}
			e.wantStatus(t, id, outbox.StatusDone)
		}
	}
	if n := strings.Count(e.logs.String(), "no listener here"); n > 2*len(types) {
		t.Errorf("%d 'no listener' warnings; want at most one per type per instance per minute", n)
	}

	// A type no subscription anywhere takes: the event is completed at
	// once (DONE, no attempt, no delivery), not claimed and handed back
	// for ever; a subscription registered later is owed only the events
	// committed after its registration. The instance here has a
	// subscription, of another type (one with none claims nothing).
	cfg := fastConfig()
	cfg.NoListenerDelay = time.Hour // a hand-back would leave it NEW
	m := &counting{}
	cfg.Metrics = m
	late := e.outbox(t, cfg)
	late.Handle("other", func(context.Context, outbox.Event) error { return nil }, "Other")
	start(t, late)
	id := e.publish(t, late, outbox.Envelope{Type: "Late", JSON: []byte(payload)})
	for deadline := time.Now().Add(wait); ; {
		if _, err := late.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec, err := e.store.(driver.Inspector).Inspect(context.Background(), id)
		if errors.Is(err, driver.ErrNotFound) {
			break // completed and deleted (DeleteDelivered)
		}
		if err == nil && rec.Status == outbox.StatusDone {
			if rec.Attempts != 0 || len(rec.Deliveries) != 0 {
				t.Fatalf("completed with %d attempts and deliveries %+v; want none", rec.Attempts, rec.Deliveries)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an event of a type no subscription takes is still %v (%v); want DONE at once", rec.Status, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := late.Subscribe(outbox.Subscription{Name: "late", Types: []outbox.EventType{"Late"}, Handler: func(context.Context, outbox.Event) error { return nil }}); !errors.Is(err, outbox.ErrStarted) {
		t.Fatalf("Subscribe after Start: %v; want ErrStarted", err)
	}
	got := make(chan outbox.Event, 2)
	next := e.outbox(t, fastConfig())
	next.Handle("late", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, "Late")
	start(t, next)
	id2 := e.publish(t, next, outbox.Envelope{Type: "Late", JSON: []byte(payload)})
	if ev := recv(t, got, "the late listener's event"); ev.ID != id2 {
		t.Fatalf("late listener got %s; want %s, committed after its registration (%s was complete before it)", ev.ID, id2, id)
	}
}

// An instance with no subscription (one that only publishes) claims
// nothing: what it claimed it could only hand back, for NoListenerDelay,
// delaying the instance that delivers it. Its polls leave the event free;
// a worker started later takes it at its first poll.
func testPublishOnlyInstanceClaimsNothing(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.NoListenerDelay = time.Hour // a hand-back would keep it from the worker
	m := &counting{}
	cfg.Metrics = m
	api := e.outbox(t, cfg)
	start(t, api)
	id := e.publish(t, api, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	for range 3 {
		n, err := api.Poll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("the publish-only instance's poll queued %d events", n)
		}
	}
	if n := m.noListener.Load(); n != 0 {
		t.Fatalf("the publish-only instance claimed and handed back %d events", n)
	}
	got := make(chan string, 1)
	worker := e.outbox(t, fastConfig())
	worker.Handle("worker", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil }, typeA)
	start(t, worker)
	if d := recv(t, got, "the worker's event"); d != id {
		t.Fatalf("worker got %s; want %s", d, id)
	}
}
