package prom_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/prom"
)

func newMetrics(t *testing.T, opts ...prom.Option) (*prom.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := prom.New(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func TestCountersAndGaugesMapToTheirNames(t *testing.T) {
	m, reg := newMetrics(t)
	m.Published("OrderPlaced")
	m.Published("OrderPlaced")
	m.Published("OrderCancelled")
	m.HotEnqueued()
	m.HotEnqueued()
	m.HotDropped()
	m.ColdEnqueued(3)
	m.ColdEnqueued(4)
	m.QueueDepths(5, 6)
	m.QueueCapacities(1000, 2000)
	m.Backlog(outbox.Stats{New: 40, Retry: 2, Done: 1000, Dead: 1, DeadDeliveries: 2, OldestPending: 90 * time.Second})
	m.LeasesReclaimed(2)
	m.Cleaned(1000)
	m.Cleaned(17)

	want := `
# HELP txoutbox_cleaned_rows_total Delivered (and, with CleanupDead, dead) rows deleted by the cleanup of Config.Retention, and archived events deleted by that of Config.ArchiveRetention.
# TYPE txoutbox_cleaned_rows_total counter
txoutbox_cleaned_rows_total 1017
# HELP txoutbox_cold_enqueued_total Events the poller claimed and queued on the cold queue.
# TYPE txoutbox_cold_enqueued_total counter
txoutbox_cold_enqueued_total 7
# HELP txoutbox_events_published_total Events written by Publish, by event type; counted once their transaction committed. Types past the first MaxEventTypes are counted as "other".
# TYPE txoutbox_events_published_total counter
txoutbox_events_published_total{event_type="OrderCancelled"} 1
txoutbox_events_published_total{event_type="OrderPlaced"} 2
# HELP txoutbox_hot_dropped_total Committed events the hot path left to the poller: the hot queue was full, or the transaction committed too late for its lease.
# TYPE txoutbox_hot_dropped_total counter
txoutbox_hot_dropped_total 1
# HELP txoutbox_hot_enqueued_total Events handed to the dispatcher's hot queue after their transaction committed.
# TYPE txoutbox_hot_enqueued_total counter
txoutbox_hot_enqueued_total 2
# HELP txoutbox_leases_reclaimed_total Events taken over from an instance whose lease had expired.
# TYPE txoutbox_leases_reclaimed_total counter
txoutbox_leases_reclaimed_total 2
# HELP txoutbox_dead_events Dead letters in the outbox table (events dead as a whole and dead deliveries of split events), waiting to be replayed or cleaned up; sampled every Config.StatsInterval.
# TYPE txoutbox_dead_events gauge
txoutbox_dead_events 3
# HELP txoutbox_pending_events Events not yet delivered (NEW or RETRY) in the outbox table; sampled every Config.StatsInterval.
# TYPE txoutbox_pending_events gauge
txoutbox_pending_events 42
# HELP txoutbox_pending_oldest_age_seconds Age of the oldest undelivered event in the outbox table, 0 if none; sampled every Config.StatsInterval.
# TYPE txoutbox_pending_oldest_age_seconds gauge
txoutbox_pending_oldest_age_seconds 90
# HELP txoutbox_queue_depth Events waiting in the dispatcher's in-memory queues, by queue (hot, cold); sampled every second.
# TYPE txoutbox_queue_depth gauge
txoutbox_queue_depth{queue="cold"} 6
txoutbox_queue_depth{queue="hot"} 5
# HELP txoutbox_queue_capacity Size of the dispatcher's in-memory queues, by queue (hot, cold); set when the engine starts.
# TYPE txoutbox_queue_capacity gauge
txoutbox_queue_capacity{queue="cold"} 2000
txoutbox_queue_capacity{queue="hot"} 1000
`
	names := []string{"txoutbox_cleaned_rows_total", "txoutbox_cold_enqueued_total", "txoutbox_events_published_total", "txoutbox_hot_dropped_total",
		"txoutbox_hot_enqueued_total", "txoutbox_leases_reclaimed_total", "txoutbox_pending_events",
		"txoutbox_pending_oldest_age_seconds", "txoutbox_dead_events", "txoutbox_queue_depth", "txoutbox_queue_capacity"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A later sample replaces the gauges.
	m.Backlog(outbox.Stats{})
	if got := testutil.ToFloat64(only(m, "txoutbox_pending_oldest_age_seconds")); got != 0 {
		t.Errorf("oldest pending age after an empty sample = %v, want 0", got)
	}
}

type collectorFunc func(chan<- prometheus.Metric)

func (f collectorFunc) Describe(chan<- *prometheus.Desc)    {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

func TestDispatchOutcomesStartAtZeroAndCountByPathAndOutcome(t *testing.T) {
	m, reg := newMetrics(t)
	want := func(done, retry, dead float64) string {
		return `
# HELP txoutbox_dispatch_total Delivery attempts by path (hot, cold) and outcome: done (all listeners succeeded), retry (one failed, retry scheduled), dead (failed for the last time).
# TYPE txoutbox_dispatch_total counter
txoutbox_dispatch_total{outcome="dead",path="cold"} ` + ftoa(dead) + `
txoutbox_dispatch_total{outcome="dead",path="hot"} 0
txoutbox_dispatch_total{outcome="done",path="cold"} 0
txoutbox_dispatch_total{outcome="done",path="hot"} ` + ftoa(done) + `
txoutbox_dispatch_total{outcome="retry",path="cold"} 0
txoutbox_dispatch_total{outcome="retry",path="hot"} ` + ftoa(retry) + `
`
	}
	// Before anything happened, every series exists with 0: an alert on
	// dead letters needs the series to exist.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(0, 0, 0)), "txoutbox_dispatch_total"); err != nil {
		t.Error(err)
	}
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeDone, time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeDone, time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeRetry, time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathCold, outbox.OutcomeDead, time.Millisecond)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(2, 1, 1)), "txoutbox_dispatch_total"); err != nil {
		t.Error(err)
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func TestFailuresByEventType(t *testing.T) {
	m, reg := newMetrics(t)
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeDone, time.Millisecond) // not a failure
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeRetry, time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathCold, outbox.OutcomeRetry, time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathCold, outbox.OutcomeDead, time.Millisecond)
	m.Dispatched("OrderCancelled", outbox.PathHot, outbox.OutcomeRetry, time.Millisecond)
	want := `
# HELP txoutbox_delivery_failures_total Failed delivery attempts by event type and outcome: retry (another attempt scheduled) or dead (failed for the last time).
# TYPE txoutbox_delivery_failures_total counter
txoutbox_delivery_failures_total{event_type="OrderCancelled",outcome="retry"} 1
txoutbox_delivery_failures_total{event_type="OrderPlaced",outcome="dead"} 1
txoutbox_delivery_failures_total{event_type="OrderPlaced",outcome="retry"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_delivery_failures_total"); err != nil {
		t.Error(err)
	}
}

func TestLatencyHistogramSplitsHotAndColdInSeconds(t *testing.T) {
	m, reg := newMetrics(t, prom.WithLatencyBuckets([]float64{0.001, 1}))
	m.Latency(outbox.PathHot, 300*time.Microsecond)
	m.Latency(outbox.PathHot, 2*time.Millisecond)
	m.Latency(outbox.PathCold, 3*time.Second)
	m.Latency(outbox.PathCold, -time.Second) // the database's clock ran ahead: counted as 0
	want := `
# HELP txoutbox_delivery_latency_seconds Time from commit (hot path) or insert (cold path, database clock) to the first listener call of an event's first attempt, by path.
# TYPE txoutbox_delivery_latency_seconds histogram
txoutbox_delivery_latency_seconds_bucket{path="cold",le="0.001"} 1
txoutbox_delivery_latency_seconds_bucket{path="cold",le="1"} 1
txoutbox_delivery_latency_seconds_bucket{path="cold",le="+Inf"} 2
txoutbox_delivery_latency_seconds_sum{path="cold"} 3
txoutbox_delivery_latency_seconds_count{path="cold"} 2
txoutbox_delivery_latency_seconds_bucket{path="hot",le="0.001"} 1
txoutbox_delivery_latency_seconds_bucket{path="hot",le="1"} 2
txoutbox_delivery_latency_seconds_bucket{path="hot",le="+Inf"} 2
txoutbox_delivery_latency_seconds_sum{path="hot"} 0.0023
txoutbox_delivery_latency_seconds_count{path="hot"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_delivery_latency_seconds"); err != nil {
		t.Error(err)
	}
}

func TestDispatchDurationByPathAndOutcome(t *testing.T) {
	m, reg := newMetrics(t, prom.WithDurationBuckets([]float64{0.01}))
	m.Dispatched("OrderPlaced", outbox.PathCold, outbox.OutcomeRetry, 20*time.Millisecond)
	m.Dispatched("OrderPlaced", outbox.PathHot, outbox.OutcomeDone, 5*time.Millisecond)
	want := `
# HELP txoutbox_dispatch_duration_seconds Time the listeners of one delivery attempt took, by path and outcome.
# TYPE txoutbox_dispatch_duration_seconds histogram
txoutbox_dispatch_duration_seconds_bucket{outcome="dead",path="cold",le="0.01"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="dead",path="cold",le="+Inf"} 0
txoutbox_dispatch_duration_seconds_sum{outcome="dead",path="cold"} 0
txoutbox_dispatch_duration_seconds_count{outcome="dead",path="cold"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="dead",path="hot",le="0.01"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="dead",path="hot",le="+Inf"} 0
txoutbox_dispatch_duration_seconds_sum{outcome="dead",path="hot"} 0
txoutbox_dispatch_duration_seconds_count{outcome="dead",path="hot"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="done",path="cold",le="0.01"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="done",path="cold",le="+Inf"} 0
txoutbox_dispatch_duration_seconds_sum{outcome="done",path="cold"} 0
txoutbox_dispatch_duration_seconds_count{outcome="done",path="cold"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="done",path="hot",le="0.01"} 1
txoutbox_dispatch_duration_seconds_bucket{outcome="done",path="hot",le="+Inf"} 1
txoutbox_dispatch_duration_seconds_sum{outcome="done",path="hot"} 0.005
txoutbox_dispatch_duration_seconds_count{outcome="done",path="hot"} 1
txoutbox_dispatch_duration_seconds_bucket{outcome="retry",path="cold",le="0.01"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="retry",path="cold",le="+Inf"} 1
txoutbox_dispatch_duration_seconds_sum{outcome="retry",path="cold"} 0.02
txoutbox_dispatch_duration_seconds_count{outcome="retry",path="cold"} 1
txoutbox_dispatch_duration_seconds_bucket{outcome="retry",path="hot",le="0.01"} 0
txoutbox_dispatch_duration_seconds_bucket{outcome="retry",path="hot",le="+Inf"} 0
txoutbox_dispatch_duration_seconds_sum{outcome="retry",path="hot"} 0
txoutbox_dispatch_duration_seconds_count{outcome="retry",path="hot"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_dispatch_duration_seconds"); err != nil {
		t.Error(err)
	}
}

func TestUnknownPathOrOutcomeIsStillCounted(t *testing.T) {
	m, reg := newMetrics(t)
	m.Dispatched("OrderPlaced", "replay", "skipped", time.Second)
	m.Latency("replay", time.Second)
	if got := testutil.CollectAndCount(reg, "txoutbox_dispatch_total"); got != 7 {
		t.Errorf("dispatch_total series = %d, want the 6 known ones plus 1", got)
	}
	if got := testutil.CollectAndCount(reg, "txoutbox_delivery_latency_seconds"); got != 3 {
		t.Errorf("delivery_latency_seconds series = %d, want hot, cold and replay", got)
	}
}

func TestDefaultBucketsCoverSubMillisecondToMinutes(t *testing.T) {
	b := prom.DefaultBuckets
	if b[0] > 0.0001 || b[len(b)-1] < 60 {
		t.Errorf("DefaultBuckets span %v..%v; want at most 100µs up to at least a minute", b[0], b[len(b)-1])
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			t.Fatalf("DefaultBuckets not increasing at %d: %v", i, b)
		}
	}
}

func TestMetricNamesPassPromlint(t *testing.T) {
	m, _ := newMetrics(t)
	m.Published("OrderPlaced")
	problems, err := testutil.CollectAndLint(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

func TestRegisteringTwiceNeedsConstLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := prom.New(reg); err != nil {
		t.Fatal(err)
	}
	_, err := prom.New(reg)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) || !strings.HasPrefix(err.Error(), "prom: ") {
		t.Fatalf("second New on one registry: err = %v, want a prom: AlreadyRegisteredError", err)
	}
	// Several outboxes in one process: one registry, a label to tell them
	// apart (all of them labelled alike, as Prometheus requires).
	reg = prometheus.NewRegistry()
	a, err := prom.New(reg, prom.WithConstLabels(prometheus.Labels{"outbox": "orders"}))
	if err != nil {
		t.Fatal(err)
	}
	b, err := prom.New(reg, prom.WithConstLabels(prometheus.Labels{"outbox": "billing"}))
	if err != nil {
		t.Fatal(err)
	}
	a.HotEnqueued()
	b.HotEnqueued()
	b.HotEnqueued()
	want := `
# HELP txoutbox_hot_enqueued_total Events handed to the dispatcher's hot queue after their transaction committed.
# TYPE txoutbox_hot_enqueued_total counter
txoutbox_hot_enqueued_total{outbox="billing"} 2
txoutbox_hot_enqueued_total{outbox="orders"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_hot_enqueued_total"); err != nil {
		t.Error(err)
	}
}

func TestNilRegistererRegistersNothing(t *testing.T) {
	m, err := prom.New(nil, prom.WithNamespace("shop"))
	if err != nil {
		t.Fatal(err)
	}
	m.HotDropped()
	if got := testutil.ToFloat64(only(m, "shop_hot_dropped_total")); got != 1 {
		t.Errorf("shop_hot_dropped_total = %v, want 1", got)
	}
}

// only narrows a collector to one metric family, for testutil.ToFloat64.
func only(c prometheus.Collector, name string) prometheus.Collector {
	return collectorFunc(func(ch chan<- prometheus.Metric) {
		all := make(chan prometheus.Metric, 100)
		go func() { c.Collect(all); close(all) }()
		for m := range all {
			if strings.Contains(m.Desc().String(), `fqName: "`+name+`"`) {
				ch <- m
			}
		}
	})
}

func TestOptionsPanicOnProgrammerErrors(t *testing.T) {
	for name, f := range map[string]func(){
		"empty namespace":       func() { prom.WithNamespace("") },
		"no buckets":            func() { prom.WithLatencyBuckets(nil) },
		"unsorted buckets":      func() { prom.WithDurationBuckets([]float64{1, 0.5}) },
		"native factor too low": func() { prom.WithNativeHistograms(1) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v := recover(); v == nil || !strings.HasPrefix(v.(string), "prom: ") {
					t.Errorf("recovered %v, want a prom: panic", v)
				}
			}()
			f()
		})
	}
}

func TestNativeHistogramsKeepClassicBuckets(t *testing.T) {
	m, reg := newMetrics(t, prom.WithNativeHistograms(1.1))
	m.Latency(outbox.PathHot, time.Millisecond)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "txoutbox_delivery_latency_seconds" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			h := mm.GetHistogram()
			if mm.GetLabel()[0].GetValue() == "hot" {
				if h.GetSchema() == 0 && h.GetZeroThreshold() == 0 || len(h.GetBucket()) != len(prom.DefaultBuckets) {
					t.Errorf("hot latency: schema %d, zero threshold %v, %d classic buckets; want native and %d classic",
						h.GetSchema(), h.GetZeroThreshold(), len(h.GetBucket()), len(prom.DefaultBuckets))
				}
				return
			}
		}
	}
	t.Fatal("no hot latency series")
}

func TestMain(m *testing.M) { leakcheck.Main(m) }

// A subscription's sampled lag sets its lag gauges, and its blocked keys
// gauge.
func TestSubscriptionLagAndBlockedKeys(t *testing.T) {
	m, reg := newMetrics(t)
	m.SubscriptionLag([]outbox.Lag{{Subscription: "ledger", Pending: 4, Retrying: 1, Dead: 2, Oldest: 3 * time.Second, BlockedKeys: 2}, {Subscription: "mailer"}})
	want := `
# HELP txoutbox_subscription_blocked_keys Ordering keys blocked for an Ordered subscription by a dead event (its later events of the key wait until the event is replayed or skipped), counted up to 100; sampled every Config.StatsInterval.
# TYPE txoutbox_subscription_blocked_keys gauge
txoutbox_subscription_blocked_keys{subscription="ledger"} 2
txoutbox_subscription_blocked_keys{subscription="mailer"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_subscription_blocked_keys"); err != nil {
		t.Error(err)
	}
	if got := testutil.CollectAndCount(reg, "txoutbox_subscription_lag_events"); got != 6 {
		t.Errorf("%d lag gauges; want 6 (3 states × 2 subscriptions)", got)
	}
}
