package prom

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txoutbox/txoutbox/outbox"
)

// DefaultNamespace prefixes every metric name.
const DefaultNamespace = "txoutbox"

// DefaultBuckets are the histogram buckets, in seconds, of both the
// delivery latency and the dispatch duration: from 25µs, where the hot path
// lives (about 100µs from commit to listener on SQLite), to 5 minutes,
// where a struggling poller or a slow listener ends up.
var DefaultBuckets = []float64{
	0.000025, 0.00005,
	0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2.5, 5,
	10, 30, 60,
	120, 300,
}

// DefaultMaxEventTypes is how many event types get an event_type label
// value of their own (WithMaxEventTypes).
const DefaultMaxEventTypes = 100

// OtherEventType is the event_type label value of every event type seen
// after the first MaxEventTypes.
const OtherEventType = "other"

// Label values. Path and outcome values are those of outbox.Path and
// outbox.Outcome.
var (
	paths    = []outbox.Path{outbox.PathHot, outbox.PathCold}
	outcomes = []outbox.Outcome{outbox.OutcomeDone, outbox.OutcomeRetry, outbox.OutcomeDead}
)

// Option configures New.
type Option func(*options)

type options struct {
	namespace       string
	constLabels     prometheus.Labels
	latencyBuckets  []float64
	durationBuckets []float64
	nativeFactor    float64
	maxTypes        int
}

// WithNamespace replaces the "txoutbox" prefix of the metric names. It
// panics on an empty namespace.
func WithNamespace(ns string) Option {
	if ns == "" {
		panic("prom: WithNamespace: empty namespace")
	}
	return func(o *options) { o.namespace = ns }
}

// WithConstLabels adds labels to every metric, to tell apart several
// outboxes in one process (for example {"outbox": "orders"}).
func WithConstLabels(l prometheus.Labels) Option {
	return func(o *options) { o.constLabels = l }
}

// WithMaxEventTypes sets how many event types get an event_type label
// value of their own: the first n types seen (committed events only:
// Published is called after the commit), in this process; every later
// type is counted under OtherEventType, so that types made from data
// cannot grow the series without bound. It panics unless n > 0.
// Defaults to DefaultMaxEventTypes.
func WithMaxEventTypes(n int) Option {
	if n <= 0 {
		panic(fmt.Sprintf("prom: WithMaxEventTypes: %d must be greater than 0", n))
	}
	return func(o *options) { o.maxTypes = n }
}

// WithLatencyBuckets sets the buckets, in seconds, of
// txoutbox_delivery_latency_seconds. It panics unless they are strictly
// increasing. Defaults to DefaultBuckets.
func WithLatencyBuckets(b []float64) Option {
	checkBuckets("WithLatencyBuckets", b)
	return func(o *options) { o.latencyBuckets = slices.Clone(b) }
}

// WithDurationBuckets sets the buckets, in seconds, of
// txoutbox_dispatch_duration_seconds. It panics unless they are strictly
// increasing. Defaults to DefaultBuckets.
func WithDurationBuckets(b []float64) Option {
	checkBuckets("WithDurationBuckets", b)
	return func(o *options) { o.durationBuckets = slices.Clone(b) }
}

// WithNativeHistograms makes the two histograms also native (sparse)
// histograms with the given bucket growth factor (1.1 is a common choice),
// for Prometheus servers that scrape them. The classic buckets stay.
// Defaults to off.
func WithNativeHistograms(factor float64) Option {
	if factor <= 1 {
		panic(fmt.Sprintf("prom: WithNativeHistograms: factor %v must be greater than 1", factor))
	}
	return func(o *options) { o.nativeFactor = factor }
}

func checkBuckets(name string, b []float64) {
	if len(b) == 0 {
		panic("prom: " + name + ": no buckets")
	}
	for i := 1; i < len(b); i++ {
		if b[i] <= b[i-1] {
			panic(fmt.Sprintf("prom: %s: buckets must be strictly increasing, but %v follows %v", name, b[i], b[i-1]))
		}
	}
}

// Metrics exports an outbox's measurements to Prometheus. Pass it as
// outbox.Config.Metrics. It is safe for concurrent use, and it is a
// prometheus.Collector: New registers it, as one collector, on the
// Registerer it is given.
type Metrics struct {
	published        *prometheus.CounterVec
	hotEnqueued      prometheus.Counter
	hotDropped       prometheus.Counter
	coldEnqueued     prometheus.Counter
	dispatched       *prometheus.CounterVec
	dispatchDuration *prometheus.HistogramVec
	failures         *prometheus.CounterVec
	latency          *prometheus.HistogramVec
	queueDepth       *prometheus.GaugeVec
	queueCapacity    *prometheus.GaugeVec
	pending          prometheus.Gauge
	oldestPending    prometheus.Gauge
	dead             prometheus.Gauge
	leasesReclaimed  prometheus.Counter
	cleaned          prometheus.Counter
	noListener       *prometheus.CounterVec
	unknownStatus    prometheus.Gauge
	circuitOpen      *prometheus.GaugeVec
	hookDropped      *prometheus.CounterVec
	subCalls         *prometheus.CounterVec
	subDuration      *prometheus.HistogramVec
	subLag           *prometheus.GaugeVec
	subBlocked       *prometheus.GaugeVec
	subOldest        *prometheus.GaugeVec
	statements       *prometheus.CounterVec
	statementRows    *prometheus.CounterVec
	statementTime    *prometheus.HistogramVec

	types *typeLabels

	// Children resolved once, so that the hot path does no label lookup.
	dispatchedBy map[outbox.Path]map[outbox.Outcome]prometheus.Counter
	durationBy   map[outbox.Path]map[outbox.Outcome]prometheus.Observer
	latencyBy    map[outbox.Path]prometheus.Observer
	hotDepth     prometheus.Gauge
	coldDepth    prometheus.Gauge

	all []prometheus.Collector
}

var (
	_ outbox.Metrics       = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New returns the metrics of one outbox, registered on reg. A nil reg
// registers nothing: register the returned Metrics yourself, or use it
// unregistered in tests. It fails if reg already has metrics of the same
// names and labels, for example a second outbox without WithConstLabels.
func New(reg prometheus.Registerer, opts ...Option) (*Metrics, error) {
	o := options{namespace: DefaultNamespace, latencyBuckets: DefaultBuckets, durationBuckets: DefaultBuckets, maxTypes: DefaultMaxEventTypes}
	for _, opt := range opts {
		opt(&o)
	}
	ns, cl := o.namespace, o.constLabels
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl})
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		ho := prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl, Buckets: buckets}
		if o.nativeFactor > 0 {
			ho.NativeHistogramBucketFactor = o.nativeFactor
			ho.NativeHistogramMaxBucketNumber = 160
			ho.NativeHistogramMinResetDuration = time.Hour
		}
		return prometheus.NewHistogramVec(ho, labels)
	}
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "events_published_total", ConstLabels: cl,
			Help: "Events written by Publish, by event type; counted once their transaction committed. Types past the first MaxEventTypes are counted as \"other\"."}, []string{"event_type"}),
		hotEnqueued:  counter("hot_enqueued_total", "Events handed to the dispatcher's hot queue after their transaction committed."),
		hotDropped:   counter("hot_dropped_total", "Committed events the hot path left to the poller: the hot queue was full, or the transaction committed too late for its lease."),
		coldEnqueued: counter("cold_enqueued_total", "Events the poller claimed and queued on the cold queue."),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dispatch_total", ConstLabels: cl,
			Help: "Delivery attempts by path (hot, cold) and outcome: done (all listeners succeeded), retry (one failed, retry scheduled), dead (failed for the last time)."},
			[]string{"path", "outcome"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "delivery_failures_total", ConstLabels: cl,
			Help: "Failed delivery attempts by event type and outcome: retry (another attempt scheduled) or dead (failed for the last time)."},
			[]string{"event_type", "outcome"}),
		dispatchDuration: histogram("dispatch_duration_seconds",
			"Time the listeners of one delivery attempt took, by path and outcome.", o.durationBuckets, "path", "outcome"),
		latency: histogram("delivery_latency_seconds",
			"Time from commit (hot path) or insert (cold path, database clock) to the first listener call of an event's first attempt, by path.", o.latencyBuckets, "path"),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "queue_depth", ConstLabels: cl,
			Help: "Events waiting in the dispatcher's in-memory queues, by queue (hot, cold); sampled every second."}, []string{"queue"}),
		queueCapacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "queue_capacity", ConstLabels: cl,
			Help: "Size of the dispatcher's in-memory queues, by queue (hot, cold); set when the engine starts."}, []string{"queue"}),
		pending:         gauge("pending_events", "Events not yet delivered (NEW or RETRY) in the outbox table; sampled every Config.StatsInterval."),
		oldestPending:   gauge("pending_oldest_age_seconds", "Age of the oldest undelivered event in the outbox table, 0 if none; sampled every Config.StatsInterval."),
		dead:            gauge("dead_events", "Dead letters in the outbox table (events dead as a whole and dead deliveries of split events), waiting to be replayed or cleaned up; sampled every Config.StatsInterval."),
		leasesReclaimed: counter("leases_reclaimed_total", "Events taken over from an instance whose lease had expired."),
		cleaned:         counter("cleaned_rows_total", "Delivered (and, with CleanupDead, dead) rows deleted by the cleanup of Config.Retention, and archived events deleted by that of Config.ArchiveRetention."),
		noListener: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "no_listener_total", ConstLabels: cl,
			Help: "Events this instance had no listener for, by event type: handed back to the table (no attempt spent) for an instance that has one."}, []string{"event_type"}),
		circuitOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "circuit_open", ConstLabels: cl,
			Help: "1 while a subscription's circuit is open on this instance (its destination is unavailable: events wait without spending attempts), else 0."}, []string{"subscription"}),
		hookDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "hook_dropped_total", ConstLabels: cl,
			Help: "Failure hook calls (Subscription.OnRetry, OnDead) not made, by subscription: the subscription's queue of calls was full (the hook is slower than the failures come), or Close came first."}, []string{"subscription"}),
		subCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "subscription_deliveries_total", ConstLabels: cl,
			Help: "Outcomes of each subscription's deliveries: done, retry (failed, another attempt scheduled), dead (failed for the last time), deferred (paused, circuit open, destination unavailable or owed elsewhere: no attempt spent)."},
			[]string{"subscription", "outcome"}),
		subDuration: histogram("subscription_call_duration_seconds",
			"Time one handler call of a subscription took (a batch call once per event of the batch).", o.durationBuckets, "subscription"),
		subLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "subscription_lag_events", ConstLabels: cl,
			Help: "What each subscription has not delivered yet, by state: pending (new events of its types and deferred deliveries), retrying, dead; sampled every Config.StatsInterval."},
			[]string{"subscription", "state"}),
		subBlocked: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "subscription_blocked_keys", ConstLabels: cl,
			Help: "Ordering keys blocked for an Ordered subscription by a dead event (its later events of the key wait until the event is replayed or skipped), counted up to 100; sampled every Config.StatsInterval."},
			[]string{"subscription"}),
		subOldest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "subscription_oldest_age_seconds", ConstLabels: cl,
			Help: "Age of the oldest event a subscription has not delivered yet (pending or retrying), 0 if none; sampled every Config.StatsInterval."},
			[]string{"subscription"}),
		statements: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "store_statements_total", ConstLabels: cl,
			Help: "The engine's own store calls, by statement: claim, claim_deliveries, mark_done, complete_deliveries, split, fail_delivery, extend_leases, release."},
			[]string{"statement"}),
		statementRows: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "store_statement_rows_total", ConstLabels: cl,
			Help: "Rows the engine's store calls returned or changed, by statement; divided by store_statements_total: rows per statement."},
			[]string{"statement"}),
		statementTime: histogram("store_statement_duration_seconds",
			"Time the engine's store calls took (with the engine's retries), by statement.", o.durationBuckets, "statement"),
		unknownStatus: gauge("unknown_status_events", "Rows whose status the engine does not know (never delivered; written by hand or by a newer version); sampled every Config.StatsInterval."),

		types:        &typeLabels{max: o.maxTypes},
		dispatchedBy: map[outbox.Path]map[outbox.Outcome]prometheus.Counter{},
		durationBy:   map[outbox.Path]map[outbox.Outcome]prometheus.Observer{},
		latencyBy:    map[outbox.Path]prometheus.Observer{},
	}
	// Create every path/outcome series up front, so that rates and alerts
	// (dead letters) see a 0 instead of no series.
	for _, p := range paths {
		m.dispatchedBy[p] = map[outbox.Outcome]prometheus.Counter{}
		m.durationBy[p] = map[outbox.Outcome]prometheus.Observer{}
		for _, oc := range outcomes {
			m.dispatchedBy[p][oc] = m.dispatched.WithLabelValues(string(p), string(oc))
			m.durationBy[p][oc] = m.dispatchDuration.WithLabelValues(string(p), string(oc))
		}
		m.latencyBy[p] = m.latency.WithLabelValues(string(p))
	}
	m.hotDepth = m.queueDepth.WithLabelValues(string(outbox.PathHot))
	m.coldDepth = m.queueDepth.WithLabelValues(string(outbox.PathCold))
	m.all = []prometheus.Collector{m.published, m.hotEnqueued, m.hotDropped, m.coldEnqueued, m.dispatched, m.failures,
		m.dispatchDuration, m.latency, m.queueDepth, m.queueCapacity, m.pending, m.oldestPending, m.dead, m.leasesReclaimed, m.cleaned, m.noListener, m.unknownStatus, m.circuitOpen, m.hookDropped,
		m.subCalls, m.subDuration, m.subLag, m.subBlocked, m.subOldest, m.statements, m.statementRows, m.statementTime}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, fmt.Errorf("prom: register outbox metrics: %w", err)
		}
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// Published implements outbox.Metrics.
func (m *Metrics) Published(t outbox.EventType) {
	m.published.WithLabelValues(m.types.label(t)).Inc()
}

// HotEnqueued implements outbox.Metrics.
func (m *Metrics) HotEnqueued() { m.hotEnqueued.Inc() }

// HotDropped implements outbox.Metrics.
func (m *Metrics) HotDropped() { m.hotDropped.Inc() }

// ColdEnqueued implements outbox.Metrics.
func (m *Metrics) ColdEnqueued(n int) { m.coldEnqueued.Add(float64(n)) }

// Dispatched implements outbox.Metrics.
func (m *Metrics) Dispatched(t outbox.EventType, p outbox.Path, o outbox.Outcome, took time.Duration) {
	if o != outbox.OutcomeDone {
		m.failures.WithLabelValues(m.types.label(t), string(o)).Inc()
	}
	c, ok := m.dispatchedBy[p][o]
	if !ok { // a path or outcome added to outbox after this package
		m.dispatched.WithLabelValues(string(p), string(o)).Inc()
		m.dispatchDuration.WithLabelValues(string(p), string(o)).Observe(took.Seconds())
		return
	}
	c.Inc()
	m.durationBy[p][o].Observe(took.Seconds())
}

// Latency implements outbox.Metrics.
func (m *Metrics) Latency(p outbox.Path, d time.Duration) {
	d = max(d, 0) // the cold path's start is on the database's clock, which may be ahead
	if obs, ok := m.latencyBy[p]; ok {
		obs.Observe(d.Seconds())
		return
	}
	m.latency.WithLabelValues(string(p)).Observe(d.Seconds())
}

// QueueDepths implements outbox.Metrics.
func (m *Metrics) QueueDepths(hot, cold int) {
	m.hotDepth.Set(float64(hot))
	m.coldDepth.Set(float64(cold))
}

// QueueCapacities implements outbox.Metrics.
func (m *Metrics) QueueCapacities(hot, cold int) {
	m.queueCapacity.WithLabelValues(string(outbox.PathHot)).Set(float64(hot))
	m.queueCapacity.WithLabelValues(string(outbox.PathCold)).Set(float64(cold))
}

// Backlog implements outbox.Metrics.
func (m *Metrics) Backlog(s outbox.Stats) {
	m.pending.Set(float64(s.Pending()))
	m.oldestPending.Set(s.OldestPending.Seconds())
	m.dead.Set(float64(s.DeadLetters()))
	m.unknownStatus.Set(float64(s.Unknown))
}

// NoListener implements outbox.Metrics.
func (m *Metrics) NoListener(t outbox.EventType) {
	m.noListener.WithLabelValues(m.types.label(t)).Inc()
}

// Circuit implements outbox.Metrics.
func (m *Metrics) Circuit(sub string, s outbox.CircuitState) {
	v := 0.0
	if s != outbox.CircuitClosed {
		v = 1
	}
	m.circuitOpen.WithLabelValues(sub).Set(v)
}

// Cleaned implements outbox.Metrics.
func (m *Metrics) Cleaned(n int64) { m.cleaned.Add(float64(n)) }

// LeasesReclaimed implements outbox.Metrics.
func (m *Metrics) LeasesReclaimed(n int) { m.leasesReclaimed.Add(float64(n)) }

// Delivered implements outbox.Metrics.
func (m *Metrics) Delivered(sub string, o outbox.Outcome, took time.Duration) {
	m.subCalls.WithLabelValues(sub, string(o)).Inc()
	if o != outbox.OutcomeDeferred {
		m.subDuration.WithLabelValues(sub).Observe(took.Seconds())
	}
}

// SubscriptionLag implements outbox.Metrics.
func (m *Metrics) SubscriptionLag(lags []outbox.Lag) {
	for _, l := range lags {
		m.subLag.WithLabelValues(l.Subscription, "pending").Set(float64(l.Pending))
		m.subLag.WithLabelValues(l.Subscription, "retrying").Set(float64(l.Retrying))
		m.subLag.WithLabelValues(l.Subscription, "dead").Set(float64(l.Dead))
		m.subOldest.WithLabelValues(l.Subscription).Set(l.Oldest.Seconds())
		m.subBlocked.WithLabelValues(l.Subscription).Set(float64(l.BlockedKeys))
	}
}

// Statement implements outbox.Metrics.
func (m *Metrics) Statement(name string, rows int, took time.Duration) {
	m.statements.WithLabelValues(name).Inc()
	m.statementRows.WithLabelValues(name).Add(float64(rows))
	m.statementTime.WithLabelValues(name).Observe(took.Seconds())
}

// HookDropped implements outbox.Metrics.
func (m *Metrics) HookDropped(sub string) { m.hookDropped.WithLabelValues(sub).Inc() }

// typeLabels caps the event_type label: the first max types seen keep
// their name, the rest are OtherEventType. A known type costs one
// sync.Map read; a type past the cap, one atomic read more.
type typeLabels struct {
	max   int
	n     atomic.Int64
	known sync.Map // string → struct{}
	mu    sync.Mutex
}

func (l *typeLabels) label(t outbox.EventType) string {
	s := string(t)
	if _, ok := l.known.Load(s); ok {
		return s
	}
	if l.n.Load() >= int64(l.max) {
		return OtherEventType
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.known.Load(s); ok {
		return s
	}
	if l.n.Load() >= int64(l.max) {
		return OtherEventType
	}
	l.known.Store(s, struct{}{})
	l.n.Add(1)
	return s
}
