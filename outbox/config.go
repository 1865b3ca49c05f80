package outbox

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"
)

// Defaults for Config. A zero field takes the default.
const (
	DefaultWorkers             = 4
	DefaultHotQueueSize        = 1000
	DefaultColdQueueSize       = 1000
	DefaultPollInterval        = 5 * time.Second
	DefaultPollMaxInterval     = 15 * time.Second
	DefaultPollBatchSize       = 200
	DefaultSkipRecent          = time.Second
	DefaultLease               = 30 * time.Second
	DefaultListenerTimeout     = 10 * time.Second
	DefaultMaxAttempts         = 10
	DefaultRetryBase           = 200 * time.Millisecond
	DefaultRetryMax            = 60 * time.Second
	DefaultCompletionBatchSize = 500
	DefaultCompletionLinger    = 10 * time.Millisecond
	DefaultStatsInterval       = 15 * time.Second
	DefaultCleanupInterval     = time.Hour
	DefaultCleanupBatchSize    = 1000
	DefaultNoListenerDelay     = 5 * time.Second
	DefaultSubscriptionExpiry  = 24 * time.Hour
)

// Config tunes an Outbox. The zero value means the defaults; durations that
// can be switched off are switched off by a negative value.
type Config struct {
	// Workers is the number of goroutines delivering events to the
	// Handler and Tx subscriptions; it bounds how many events are in
	// delivery at once (batch subscriptions have goroutines of their own).
	// Defaults to 4.
	Workers int
	// HotQueueSize bounds the queue of events handed over after commit.
	// When it is full, Publish still succeeds and the poller delivers the
	// event later. Defaults to 1000.
	HotQueueSize int
	// ColdQueueSize bounds the queue the poller fills. Defaults to 1000.
	ColdQueueSize int

	// DisableHotPath sends every event through the poller; for tests and
	// comparisons. Defaults to false.
	DisableHotPath bool
	// DisablePoller turns the poller off: events dropped from a full hot
	// queue, retries and events of crashed instances then wait for another
	// instance. Defaults to false.
	DisablePoller bool
	// PollInterval is how often the poller looks for due events. Defaults
	// to 5s.
	PollInterval time.Duration
	// PollMaxInterval caps the poller's back-off: each poll that finds
	// nothing doubles the wait up to this, less up to a quarter at random
	// so that instances do not poll in step. Defaults to 15s, or to
	// PollInterval if that is longer.
	PollMaxInterval time.Duration
	// PollBatchSize is the most events claimed per poll. Defaults to 200.
	// Larger batches drain a backlog faster, since each claim is one
	// short transaction whatever its size (BenchmarkDrain on MariaDB,
	// 2 cores: about 16k events/s at 200, 27k at 1000); raise
	// ColdQueueSize with it so that the queue holds two batches.
	PollBatchSize int
	// SkipRecent keeps the poller off events younger than this. Leases,
	// not this window, keep the poller off events a hot path is
	// delivering; it only spares the database claims of rows that are
	// about to be delivered anyway. Negative: none. Defaults to 1s.
	SkipRecent time.Duration
	// Lease is how long a claim on an event holds without renewal. The
	// engine renews the leases of events it holds every Lease/3, so a
	// live instance keeps its events however slow its handlers; the
	// events of a dead instance are taken by another once the lease runs
	// out. A published event's lease starts at its INSERT: if the
	// transaction commits more than Lease/2 later, the hot path leaves the
	// event to the poller rather than risk a second delivery (a poller
	// takes it when its lease ends, at most Lease/2 later), so keep Lease
	// well above your longest transaction. Defaults to 30s.
	Lease time.Duration

	// ListenerTimeout bounds each handler call of the subscriptions that
	// do not set their own Timeout; its context is cancelled then, and a
	// handler that ignores its context is abandoned and the attempt counts
	// as failed. Negative: no timeout. Defaults to 10s.
	ListenerTimeout time.Duration
	// MaxAttempts is the number of failed attempts after which a
	// subscription's delivery of an event is DEAD, for the subscriptions
	// that do not set their own. Defaults to 10.
	MaxAttempts int
	// Retry computes the wait before the next attempt. Defaults to
	// ExponentialBackoff{Base: 200ms, Max: 60s}.
	Retry RetryPolicy
	// Classify decides whether a failure is worth retrying. Defaults to
	// DefaultClassifier.
	Classify Classifier

	// CompletionBatchSize is the most events marked DONE in one statement:
	// each statement is a commit, so larger batches drain a backlog faster
	// (500 drains about twice as fast as 100 on MariaDB). Defaults to 500.
	CompletionBatchSize int
	// CompletionLinger is how long the completion writer waits for more
	// delivered events before it writes a batch that is not full. Every
	// write is a commit of its own: without the wait, a trickle of events
	// costs one durable commit each. Listeners are not delayed by it.
	// While ordering keys are shared with other instances (events of
	// ordered keys were claimed from the table in the last 10s: typically
	// published on another instance behind an event held here), the wait
	// is at most 2ms: such an event waits for the DONE of the one before.
	// Negative: no wait. Defaults to 10ms.
	CompletionLinger time.Duration
	// StatsInterval is how often the table is sampled for
	// Metrics.Backlog, if the store is a StatsReader. Negative: never.
	// Defaults to 15s.
	StatsInterval time.Duration

	// Retention turns on the cleanup of delivered events: every instance
	// deletes DONE rows older than Retention (by their last due time, on
	// the database's clock, like leases) at Start and then every
	// CleanupInterval, in
	// batches of CleanupBatchSize rows. The store must implement driver.Cleaner.
	// NEW and RETRY rows are never deleted. Zero (the default) keeps every
	// row; the store's Cleanup can still be called by hand.
	Retention time.Duration
	// CleanupDead makes the cleanup delete DEAD rows older than Retention
	// too. By default dead letters stay until they are replayed or deleted
	// by hand.
	CleanupDead bool
	// ArchiveRetention turns on the cleanup of the archive (sqlstore's
	// Options.ArchiveDelivered, which moves delivered events there): every
	// instance deletes archived events delivered more than
	// ArchiveRetention ago (on the database's clock) at Start and then
	// every CleanupInterval, in batches of CleanupBatchSize rows. It is
	// the archive's own, independent of Retention, which never touches the
	// archive. The store must implement driver.Archiver. Zero (the
	// default) keeps every archived event; the store's CleanupArchive can
	// still be called by hand (outboxctl archive cleanup). On a
	// partitioned MySQL/MariaDB archive, sqlstore's
	// PartitionConfig.ArchiveRetention drops old days whole instead.
	ArchiveRetention time.Duration
	// CleanupInterval is the time between cleanups. Defaults to 1h.
	CleanupInterval time.Duration
	// CleanupBatchSize is the most rows one cleanup statement deletes;
	// a cleanup repeats it until fewer are left. Defaults to 1000.
	CleanupBatchSize int

	// NoListenerDelay is how long an event this instance has no subscription
	// for stays away from every poller after this instance gives it back
	// (an instance never completes an event no subscription of its own
	// accepted; in a rolling deploy, the old version gives the new types
	// back). No attempt is counted. Defaults to 5s.
	NoListenerDelay time.Duration

	// SubscriptionExpiry is how long a subscription that no running
	// instance registers any more is still owed events: instances record
	// their subscriptions in the database when they start and every
	// PollInterval, and an event is complete only once every subscription
	// registered within this window has it. A subscription removed from
	// the code stops being owed new events after it. Defaults to 24h.
	SubscriptionExpiry time.Duration

	// InstanceID names this instance as the owner of the events it claims.
	// It must be unique among the live instances sharing a table: Close
	// releases every lease held under it. Defaults to host name, process
	// id and a random suffix.
	InstanceID string
	// Logger receives the engine's logs. Payloads and header values are
	// never logged. Defaults to slog.Default().
	Logger *slog.Logger
	// Metrics receives the engine's measurements. Defaults to NopMetrics.
	Metrics Metrics
	// Interceptors see every Publish and wrap every handler call, in
	// order, the first outermost (tracing: adapters/otel). See
	// Interceptor. Defaults to none.
	Interceptors []Interceptor
}

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.HotQueueSize = cmp.Or(c.HotQueueSize, DefaultHotQueueSize)
	c.ColdQueueSize = cmp.Or(c.ColdQueueSize, DefaultColdQueueSize)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.PollMaxInterval = cmp.Or(c.PollMaxInterval, max(DefaultPollMaxInterval, c.PollInterval))
	c.PollBatchSize = cmp.Or(c.PollBatchSize, DefaultPollBatchSize)
	c.SkipRecent = cmp.Or(c.SkipRecent, DefaultSkipRecent)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.ListenerTimeout = cmp.Or(c.ListenerTimeout, DefaultListenerTimeout)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.CompletionBatchSize = cmp.Or(c.CompletionBatchSize, DefaultCompletionBatchSize)
	c.CompletionLinger = cmp.Or(c.CompletionLinger, DefaultCompletionLinger)
	c.StatsInterval = cmp.Or(c.StatsInterval, DefaultStatsInterval)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.CleanupBatchSize = cmp.Or(c.CleanupBatchSize, DefaultCleanupBatchSize)
	c.NoListenerDelay = cmp.Or(c.NoListenerDelay, DefaultNoListenerDelay)
	c.SubscriptionExpiry = cmp.Or(c.SubscriptionExpiry, DefaultSubscriptionExpiry)
	if c.Retry == nil {
		c.Retry = ExponentialBackoff{Base: DefaultRetryBase, Max: DefaultRetryMax}
	}
	if c.Classify == nil {
		c.Classify = DefaultClassifier
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "host"), os.Getpid(), NewID()[20:])
		if len(c.InstanceID) > 64 {
			c.InstanceID = c.InstanceID[len(c.InstanceID)-64:]
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = NopMetrics{}
	}
	return c
}

// validate reports the first field out of range, by name.
func (c *Config) validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v < 0 {
			errs = append(errs, fmt.Errorf("outbox: Config.%s is %d; it must be positive, or 0 for the default", name, v))
		}
	}
	positive("Workers", c.Workers)
	positive("HotQueueSize", c.HotQueueSize)
	positive("ColdQueueSize", c.ColdQueueSize)
	positive("PollBatchSize", c.PollBatchSize)
	positive("MaxAttempts", c.MaxAttempts)
	positive("CompletionBatchSize", c.CompletionBatchSize)
	positive("CleanupBatchSize", c.CleanupBatchSize)
	durations := []struct {
		name string
		v    time.Duration
	}{{"PollInterval", c.PollInterval}, {"PollMaxInterval", c.PollMaxInterval}, {"Lease", c.Lease}, {"CleanupInterval", c.CleanupInterval}, {"NoListenerDelay", c.NoListenerDelay}, {"SubscriptionExpiry", c.SubscriptionExpiry}}
	for _, d := range durations {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("outbox: Config.%s is %v; it must be positive, or 0 for the default", d.name, d.v))
		}
	}
	if c.Lease > 0 && c.Lease < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("outbox: Config.Lease is %v; it must be at least 100ms", c.Lease))
	}
	if c.PollMaxInterval > 0 && c.PollInterval > 0 && c.PollMaxInterval < c.PollInterval {
		errs = append(errs, fmt.Errorf("outbox: Config.PollMaxInterval (%v) is less than Config.PollInterval (%v)", c.PollMaxInterval, c.PollInterval))
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("outbox: Config.Retention is %v; it must be positive, or 0 to keep every row", c.Retention))
	}
	if c.ArchiveRetention < 0 {
		errs = append(errs, fmt.Errorf("outbox: Config.ArchiveRetention is %v; it must be positive, or 0 to keep every archived event", c.ArchiveRetention))
	}
	if c.CleanupDead && c.Retention == 0 {
		errs = append(errs, errors.New("outbox: Config.CleanupDead is set but Config.Retention is 0; set the retention of dead letters"))
	}
	for i, ic := range c.Interceptors {
		if ic == nil {
			errs = append(errs, fmt.Errorf("outbox: Config.Interceptors[%d] is nil", i))
		}
	}
	if len(c.InstanceID) > 64 {
		errs = append(errs, fmt.Errorf("outbox: Config.InstanceID is %d bytes; the limit is 64", len(c.InstanceID)))
	}
	return errors.Join(errs...)
}

// RetryPolicy computes how long to wait before the next delivery attempt,
// given how many attempts have failed so far (1 after the first failure).
type RetryPolicy interface {
	Delay(failures int) time.Duration
}

// RetryFunc adapts a function to RetryPolicy.
type RetryFunc func(failures int) time.Duration

// Delay calls f.
func (f RetryFunc) Delay(failures int) time.Duration { return f(failures) }

// ExponentialBackoff waits Base·2^(failures−1), capped at Max, times a
// random jitter factor in [0.5, 1.5).
type ExponentialBackoff struct {
	Base, Max time.Duration
}

// Delay returns the wait after the given number of failures.
func (b ExponentialBackoff) Delay(failures int) time.Duration {
	return jitter(b.Ceiling(failures))
}

// Ceiling returns the delay before jitter: Base·2^(failures−1) capped at
// Max. The delay returned by Delay lies in [Ceiling/2, Ceiling·1.5).
func (b ExponentialBackoff) Ceiling(failures int) time.Duration {
	base := cmp.Or(b.Base, DefaultRetryBase)
	limit := cmp.Or(b.Max, DefaultRetryMax)
	d := base
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// Decision is what to do with an event whose handler failed.
type Decision int

const (
	// DecisionRetry schedules another attempt, unless MaxAttempts is
	// reached.
	DecisionRetry Decision = iota
	// DecisionDead gives up on the event at once.
	DecisionDead
)

// Classifier decides, from a handler's error, whether to retry.
type Classifier func(err error) Decision

// DefaultClassifier retries every error except those wrapped with
// Permanent.
func DefaultClassifier(err error) Decision {
	var p *permanentError
	if errors.As(err, &p) {
		return DecisionDead
	}
	return DecisionRetry
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as not worth retrying: with the DefaultClassifier the
// event goes DEAD at once. A handler returns it for input it can never
// handle.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}
