package storetest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// Engine cases: the hot path and the poller.

// 18.2: after commit the event goes through the hot path and is DONE.
func testCommitHotPath(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true // only the hot path can deliver
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	got := make(chan outbox.Event, 1)
	ob.Handle("listener-1", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, typeA)
	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42"})
	ev := recv(t, got, "hot delivery")
	if ev.ID != id || ev.Path != outbox.PathHot || ev.Attempt != 1 || string(ev.JSON) != payload || ev.AggregateID != "42" {
		t.Fatalf("delivered %+v; want id %s on the hot path, attempt 1, the published payload", ev, id)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
	if m.hotEnqueued.Load() != 1 || m.published.Load() != 1 || m.outcome(outbox.OutcomeDone) != 1 {
		t.Fatalf("metrics: published %d, hot enqueued %d, done %d; want 1 each", m.published.Load(), m.hotEnqueued.Load(), m.outcome(outbox.OutcomeDone))
	}
}

// 18.3: a full hot queue never fails Publish; the rows stay NEW and the
// poller delivers them all.
func testHotQueueFull(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.HotQueueSize = 1
	cfg.Workers = 1
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	const n = 20
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	// Not started: nothing drains the hot queue, so all but one drop.
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	if got := m.hotDropped.Load(); got != n-1 {
		t.Fatalf("hot dropped = %d, want %d", got, n-1)
	}
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusNew)
	}
	if !strings.Contains(e.logs.String(), "hot queue full") {
		t.Fatalf("no warning logged for the full hot queue; logs:\n%s", e.logs)
	}
	start(t, ob)
	rec.wait(t, wait)
	closeNow(t, ob)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if m.coldEnqueued.Load() < n-1 {
		t.Fatalf("cold enqueued = %d, want at least %d", m.coldEnqueued.Load(), n-1)
	}
}

// A transaction that commits more than half a lease after publishing may
// find its lease expired and another instance entitled to the event: the
// hot path stays out and the event is delivered once, by a poller.
func testLateCommitLeftToPoller(t *testing.T, e *env) {
	const lease = 200 * time.Millisecond
	rec := newRecorder(1)
	var obs []*outbox.Outbox
	var ms []*counting
	for range 2 {
		cfg := fastConfig()
		cfg.Lease = lease
		m := &counting{}
		cfg.Metrics = m
		ob := e.outbox(t, cfg)
		ob.Handle("all", rec.listen)
		start(t, ob)
		obs, ms = append(obs, ob), append(ms, m)
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	id, err := obs[0].PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		tx.Rollback()
		t.Fatalf("PublishTx: %v", err)
	}
	// The transaction stays open past the whole lease. Elapsed time is the
	// condition under test: there is no signal to wait for instead.
	time.Sleep(lease + lease/2)
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	rec.wait(t, wait)
	for _, ob := range obs {
		closeNow(t, ob) // delivers anything still queued: a duplicate would show
	}
	e.wantStatus(t, id, outbox.StatusDone)
	counts, events := rec.snapshot()
	if counts[id] != 1 || events[0].Path != outbox.PathCold {
		t.Fatalf("delivered %d times, first on the %v path; want once, by a poller", counts[id], events[0].Path)
	}
	if got, hot := ms[0].hotDropped.Load(), ms[0].hotEnqueued.Load(); got != 1 || hot != 0 {
		t.Fatalf("publisher: hot dropped %d, hot enqueued %d; want 1 and 0", got, hot)
	}
	if !strings.Contains(e.logs.String(), "committed late") {
		t.Fatalf("no warning logged for the late commit; logs:\n%s", e.logs)
	}
}

// A transaction that commits after a later one is still delivered: the
// poll is no "id greater than last seen" cursor.
func testLateCommit(t *testing.T, e *env) {
	if !e.h.ConcurrentWriters {
		t.Skip("the store's database does not allow two open write transactions")
	}
	cfg := fastConfig()
	cfg.DisableHotPath = true
	ob := e.outbox(t, cfg)
	got := make(chan string, 2)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil })
	start(t, ob)
	ctx := context.Background()
	slow, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	early, err := ob.PublishTx(ctx, slow, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	later := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if later <= early {
		t.Fatalf("ids not ordered: %s then %s", early, later)
	}
	if id := recv(t, got, "the later event"); id != later {
		t.Fatalf("delivered %s before the early transaction committed", id)
	}
	if err := slow.Commit(); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, got, "the early event"); id != early {
		t.Fatalf("delivered %s, want %s", id, early)
	}
}

// While one instance delivers an event on its hot path, however slowly,
// another instance's poller does not take it.
func testNoSteal(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	a := e.outbox(t, cfg)
	entered := make(chan struct{})
	release := make(chan struct{})
	a.Handle("all", func(context.Context, outbox.Event) error { close(entered); <-release; return nil })
	start(t, a)
	b := e.outbox(t, fastConfig()) // not started: we poll it by hand
	var stolen atomic.Int64
	b.Handle("all", func(context.Context, outbox.Event) error { stolen.Add(1); return nil })
	id := e.publish(t, a, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, entered, "the hot delivery")
	// b has no skip window at all: a "created more than SkipRecent ago"
	// rule alone would now hand the event to b.
	for range 3 {
		if n, err := b.Poll(context.Background()); err != nil || n != 0 {
			t.Fatalf("second instance's poll took %d events (err %v) while the first delivers", n, err)
		}
	}
	close(release)
	closeNow(t, a)
	closeNow(t, b)
	if rec := e.wantStatus(t, id, outbox.StatusDone); rec.Owner != "" {
		t.Fatalf("owner %q after done", rec.Owner)
	}
	if stolen.Load() != 0 {
		t.Fatal("second instance delivered the event")
	}
}
