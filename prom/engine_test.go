package prom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// TestEngineReportsThroughPrometheus runs a real outbox on SQLite with the
// exporter and checks what the engine's calls become: a hot delivery, a
// dead one, and a cold delivery of an event whose owner's lease expired.
func TestEngineReportsThroughPrometheus(t *testing.T) {
	ctx := context.Background()
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	m, reg := newMetrics(t)
	ob, err := outbox.New(store, outbox.Config{
		Metrics:       m,
		DisablePoller: true, // the test polls by hand
		SkipRecent:    time.Nanosecond,
		MaxAttempts:   1,
		StatsInterval: -1,
		HotQueueSize:  7,
		ColdQueueSize: 9,
	})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan string, 3)
	ob.Handle("good", func(ctx context.Context, ev outbox.Event) error { delivered <- "good/" + string(ev.Path); return nil }, "Good")
	ob.Handle("bad", func(ctx context.Context, ev outbox.Event) error { delivered <- "bad"; return errors.New("boom") }, "Bad")
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	publish := func(typ outbox.EventType) {
		t.Helper()
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: typ, JSON: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	publish("Good")
	if got := <-delivered; got != "good/hot" {
		t.Fatalf("first delivery %q, want good/hot", got)
	}
	publish("Bad")
	<-delivered

	// An event written by an instance that died: its lease of 1ms runs out
	// and the poller takes it over.
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	row := driver.Row{ID: outbox.NewID(), Type: "Good", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
	if err := store.Insert(ctx, tx, &row, "dead-instance", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; n == 0; {
		if n, err = ob.Poll(ctx); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the poller never took over the expired event")
		}
	}
	if got := <-delivered; got != "good/cold" {
		t.Fatalf("third delivery %q, want good/cold", got)
	}
	if err := ob.Close(ctx); err != nil { // the last Dispatched is counted once Close returns
		t.Fatal(err)
	}

	want := `
# HELP txoutbox_cold_enqueued_total Events the poller claimed and queued on the cold queue.
# TYPE txoutbox_cold_enqueued_total counter
txoutbox_cold_enqueued_total 1
# HELP txoutbox_dispatch_total Delivery attempts by path (hot, cold) and outcome: done (all listeners succeeded), retry (one failed, retry scheduled), dead (failed for the last time).
# TYPE txoutbox_dispatch_total counter
txoutbox_dispatch_total{outcome="dead",path="cold"} 0
txoutbox_dispatch_total{outcome="dead",path="hot"} 1
txoutbox_dispatch_total{outcome="done",path="cold"} 1
txoutbox_dispatch_total{outcome="done",path="hot"} 1
txoutbox_dispatch_total{outcome="retry",path="cold"} 0
txoutbox_dispatch_total{outcome="retry",path="hot"} 0
# HELP txoutbox_delivery_failures_total Failed delivery attempts by event type and outcome: retry (another attempt scheduled) or dead (failed for the last time).
# TYPE txoutbox_delivery_failures_total counter
txoutbox_delivery_failures_total{event_type="Bad",outcome="dead"} 1
# HELP txoutbox_events_published_total Events written by Publish, by event type; counted once their transaction committed. Types past the first MaxEventTypes are counted as "other".
# TYPE txoutbox_events_published_total counter
txoutbox_events_published_total{event_type="Bad"} 1
txoutbox_events_published_total{event_type="Good"} 1
# HELP txoutbox_hot_dropped_total Committed events the hot path left to the poller: the hot queue was full, or the transaction committed too late for its lease.
# TYPE txoutbox_hot_dropped_total counter
txoutbox_hot_dropped_total 0
# HELP txoutbox_hot_enqueued_total Events handed to the dispatcher's hot queue after their transaction committed.
# TYPE txoutbox_hot_enqueued_total counter
txoutbox_hot_enqueued_total 2
# HELP txoutbox_leases_reclaimed_total Events taken over from an instance whose lease had expired.
# TYPE txoutbox_leases_reclaimed_total counter
txoutbox_leases_reclaimed_total 1
# HELP txoutbox_queue_capacity Size of the dispatcher's in-memory queues, by queue (hot, cold); set when the engine starts.
# TYPE txoutbox_queue_capacity gauge
txoutbox_queue_capacity{queue="cold"} 9
txoutbox_queue_capacity{queue="hot"} 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"txoutbox_cold_enqueued_total", "txoutbox_dispatch_total", "txoutbox_delivery_failures_total", "txoutbox_events_published_total",
		"txoutbox_hot_dropped_total", "txoutbox_hot_enqueued_total", "txoutbox_leases_reclaimed_total", "txoutbox_queue_capacity"); err != nil {
		t.Error(err)
	}
	// Per subscription: the good one delivered twice, the bad one dead.
	for _, c := range []struct {
		sub, outcome string
		want         float64
	}{{"good", "done", 2}, {"bad", "dead", 1}, {"bad", "done", 0}} {
		if got := testutil.ToFloat64(m.SubscriptionDeliveries(c.sub, c.outcome)); got != c.want {
			t.Errorf("subscription_deliveries_total{subscription=%q,outcome=%q} = %v, want %v", c.sub, c.outcome, got, c.want)
		}
	}
	// The engine's statements: one claim that took the expired event, and
	// the DONE writes.
	if got := testutil.ToFloat64(m.StatementRows("claim")); got < 1 {
		t.Errorf("store_statement_rows_total{statement=claim} = %v, want ≥ 1", got)
	}
	if got := testutil.ToFloat64(m.StatementRows("mark_done")); got != 2 {
		t.Errorf("store_statement_rows_total{statement=mark_done} = %v, want 2", got)
	}
	// One latency observation per attempt, split by path.
	for path, want := range map[string]uint64{"hot": 2, "cold": 1} {
		if got := histogramCount(t, reg, "txoutbox_delivery_latency_seconds", path); got != want {
			t.Errorf("delivery latency observations on the %s path: %d, want %d", path, got, want)
		}
	}
}

// histogramCount returns the sample count of the histogram series of name
// whose path label is path.
func histogramCount(t *testing.T, reg *prometheus.Registry, name, path string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "path" && l.GetValue() == path {
					return s.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
