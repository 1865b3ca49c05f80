package outbox

import "time"

// Path says how an event reached the dispatcher.
type Path string

const (
	// PathHot is the after-commit hand-over from the publishing process.
	PathHot Path = "hot"
	// PathCold is the poller.
	PathCold Path = "cold"
)

// Outcome is the result of one delivery attempt.
type Outcome string

const (
	OutcomeDone  Outcome = "done"  // every listener succeeded
	OutcomeRetry Outcome = "retry" // a listener failed; another attempt is scheduled
	OutcomeDead  Outcome = "dead"  // a listener failed for the last time
	// OutcomeDeferred is a subscription's delivery put off without an
	// attempt: paused, its circuit open, its destination unavailable, or
	// owed by another instance.
	OutcomeDeferred Outcome = "deferred"
)

// Metrics receives the engine's measurements. Implementations must be safe
// for concurrent use and fast: they are called on the hot path. Embed
// NopMetrics to implement only some methods and stay compatible when new
// ones are added. The package github.com/txoutbox/txoutbox/prom exports them to
// Prometheus.
type Metrics interface {
	// Published counts an event written by Publish, once its transaction
	// has committed (from the transaction's after-commit hooks): events
	// of a transaction, or savepoint, that rolled back are never counted.
	Published(t EventType)
	// HotEnqueued counts an event handed to the dispatcher after commit.
	HotEnqueued()
	// HotDropped counts a committed event the hot path left to the poller:
	// the hot queue was full, or the transaction committed so late that
	// the event's lease may have run out.
	HotDropped()
	// ColdEnqueued counts events the poller queued.
	ColdEnqueued(n int)
	// Dispatched reports one delivery attempt: the event's type, its path,
	// the outcome, and the time its listeners took.
	Dispatched(t EventType, p Path, o Outcome, took time.Duration)
	// Latency reports the time from commit (hot path) or insert (cold
	// path, on the database's clock) to the first listener call of an
	// event's first attempt; retries, which wait on purpose, are not
	// reported.
	Latency(p Path, d time.Duration)
	// QueueDepths reports the lengths of the hot and cold queues.
	QueueDepths(hot, cold int)
	// QueueCapacities reports the sizes of the hot and cold queues, once,
	// when the engine starts, so that depths can be read as "% full".
	QueueCapacities(hot, cold int)
	// Backlog reports a sample of the table: rows by status (undelivered,
	// dead letters) and the age of the oldest undelivered event.
	Backlog(s Stats)
	// LeasesReclaimed counts events taken over from an instance whose lease
	// had expired.
	LeasesReclaimed(n int)
	// Cleaned counts rows deleted by the cleanup (Config.Retention), and
	// archived events deleted by the archive's (Config.ArchiveRetention).
	Cleaned(n int64)
	// NoListener counts an event this instance claimed or was handed but
	// has no listener for: it went back to the table, attempts unchanged,
	// for an instance that has one (a rolling deploy, a listener
	// registered late).
	NoListener(t EventType)
	// Circuit reports a change of a subscription's circuit on this
	// instance: CircuitOpen when its destination is unavailable (events
	// wait without spending attempts), CircuitClosed when it is back.
	Circuit(subscription string, s CircuitState)
	// Delivered reports one subscription's outcome for one event (a batch
	// reports each of its events, with the batch call's duration).
	Delivered(subscription string, o Outcome, took time.Duration)
	// SubscriptionLag reports a sample of every subscription's lag (see
	// Outbox.Lag), every Config.StatsInterval, if the store is an
	// OperatorStore.
	SubscriptionLag(lags []Lag)
	// Statement reports one of the engine's own store calls by name
	// ("claim", "claim_deliveries", "mark_done", "complete_deliveries",
	// "split", "fail_delivery", "extend_leases", "release"): the rows it
	// returned or changed, and how long it took.
	Statement(name string, rows int, took time.Duration)
	// HookDropped counts a failure hook call not made
	// (Subscription.OnRetry, OnDead): its subscription's queue of calls
	// was full, or Close came first.
	HookDropped(subscription string)
}

// NopMetrics discards every measurement.
type NopMetrics struct{}

func (NopMetrics) Published(EventType)                                {}
func (NopMetrics) HotEnqueued()                                       {}
func (NopMetrics) HotDropped()                                        {}
func (NopMetrics) ColdEnqueued(int)                                   {}
func (NopMetrics) Dispatched(EventType, Path, Outcome, time.Duration) {}
func (NopMetrics) Latency(Path, time.Duration)                        {}
func (NopMetrics) QueueDepths(int, int)                               {}
func (NopMetrics) QueueCapacities(int, int)                           {}
func (NopMetrics) Cleaned(int64)                                      {}
func (NopMetrics) Backlog(Stats)                                      {}
func (NopMetrics) LeasesReclaimed(int)                                {}
func (NopMetrics) NoListener(EventType)                               {}
func (NopMetrics) Circuit(string, CircuitState)                       {}
func (NopMetrics) Delivered(string, Outcome, time.Duration)           {}
func (NopMetrics) SubscriptionLag([]Lag)                              {}
func (NopMetrics) Statement(string, int, time.Duration)               {}
func (NopMetrics) HookDropped(string)                                 {}

var _ Metrics = NopMetrics{}
