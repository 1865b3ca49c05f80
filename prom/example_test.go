package prom_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/prom"
)

// An outbox on the embedded SQLite store, reporting to a Prometheus
// registry: one event is published, committed and delivered on the hot
// path. Serve the registry with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "prom-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}

	reg := prometheus.NewRegistry()
	metrics, err := prom.New(reg)
	if err != nil {
		panic(err)
	}
	ob, err := outbox.New(store, outbox.Config{Metrics: metrics})
	if err != nil {
		panic(err)
	}
	delivered := make(chan struct{})
	ob.Handle("notify", func(ctx context.Context, ev outbox.Event) error { close(delivered); return nil }, "OrderPlaced")
	ob.Start(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		panic(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", JSON: []byte(`{"order_id":1}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	<-delivered
	ob.Close(ctx) // drains: the dispatch is counted once Close returns

	families, _ := reg.Gather()
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "txoutbox_store_") {
			continue // the poller's statements: how many depends on timing
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter().GetValue() > 0:
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetCounter().GetValue())
			case m.GetHistogram().GetSampleCount() > 0:
				fmt.Println(f.GetName(), labels(m.GetLabel()), "count", m.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// txoutbox_delivery_latency_seconds {path="hot"} count 1
	// txoutbox_dispatch_duration_seconds {outcome="done",path="hot"} count 1
	// txoutbox_dispatch_total {outcome="done",path="hot"} 1
	// txoutbox_events_published_total {event_type="OrderPlaced"} 1
	// txoutbox_hot_enqueued_total  1
	// txoutbox_subscription_call_duration_seconds {subscription="notify"} count 1
	// txoutbox_subscription_deliveries_total {outcome="done",subscription="notify"} 1
}

func labels(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	s := "{"
	for i, l := range ls {
		if i > 0 {
			s += ","
		}
		s += l.GetName() + `="` + l.GetValue() + `"`
	}
	return s + "}"
}
