package prom_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/prom"
)

// seriesOf returns the number of series of the metric name and the value
// of each, by event_type.
func seriesOf(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			typ := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "event_type" {
					typ = l.GetValue()
				}
			}
			got[typ] += m.GetCounter().GetValue()
		}
	}
	return got
}

// The event_type label takes the first MaxEventTypes types seen; every
// later one is counted as "other", on every metric labelled by type.
func TestEventTypeLabelIsCapped(t *testing.T) {
	m, reg := newMetrics(t, prom.WithMaxEventTypes(3))
	for i := range 50 {
		typ := outbox.EventType(fmt.Sprintf("T%d", i%10))
		m.Published(typ)
		m.Dispatched(typ, outbox.PathHot, outbox.OutcomeDead, time.Millisecond)
		m.NoListener(typ)
	}
	want := map[string]float64{"T0": 5, "T1": 5, "T2": 5, prom.OtherEventType: 35}
	for _, name := range []string{"txoutbox_events_published_total", "txoutbox_delivery_failures_total", "txoutbox_no_listener_total"} {
		if got := seriesOf(t, reg, name); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if n := testutil.CollectAndCount(m, "txoutbox_events_published_total"); n != 4 {
		t.Errorf("%d published series, want 4", n)
	}
}

// Thousands of types published in transactions that roll back make no
// series; committed ones are counted, within the cap. On every database.
func TestEventTypeCountedOnlyOnceCommitted(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Open(t, name)
			store := testdb.Store(t, db)
			m, reg := newMetrics(t, prom.WithMaxEventTypes(5))
			ob, err := outbox.New(store, outbox.Config{Metrics: m, DisablePoller: true, StatsInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.Close(ctx)
			publish := func(commit bool, types ...string) {
				t.Helper()
				tx, err := outbox.BeginTx(ctx, db.DB, nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, typ := range types {
					if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: outbox.EventType(typ), JSON: []byte(`{}`)}); err != nil {
						t.Fatal(err)
					}
				}
				if commit {
					err = tx.Commit()
				} else {
					err = tx.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			var rolledBack []string
			for i := range 2000 {
				rolledBack = append(rolledBack, fmt.Sprintf("rolled-back-%d", i))
			}
			publish(false, rolledBack...)
			if got := seriesOf(t, reg, "txoutbox_events_published_total"); len(got) != 0 {
				t.Fatalf("after a rollback of 2,000 types: %d series (%v…), want none", len(got), first(got))
			}
			publish(true, "A", "B", "A", "C", "D", "E", "F", "G")
			want := map[string]float64{"A": 2, "B": 1, "C": 1, "D": 1, "E": 1, prom.OtherEventType: 2}
			if got := seriesOf(t, reg, "txoutbox_events_published_total"); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("committed: %v, want %v", got, want)
			}
		})
	}
}

func first(m map[string]float64) string {
	for k := range m {
		return k
	}
	return ""
}
