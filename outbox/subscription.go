package outbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Handler delivers one event to a destination: it sends it to a broker,
// calls a service, updates a cache. It must honour ctx, which is cancelled
// after the subscription's timeout. A nil error means delivered; an error
// fails the attempt (see Permanent and Unavailable); a panic is recovered
// and counts as an error.
//
// Delivery is at least once: a handler may see an event again, with the
// same ID, and must be idempotent. Handlers must not modify the payload or
// headers, which the handlers of other subscriptions share.
type Handler func(ctx context.Context, ev Event) error

// BatchHandler delivers several events in one call, for destinations that
// take batches (a broker's batched publish, a bulk API). It returns nil
// when every event was delivered, a *BatchError for an outcome per event,
// or any other error for a failure of the whole batch (every event fails
// with it). The events are in publish order within a path (hot or polled).
type BatchHandler func(ctx context.Context, evs []Event) error

// TxHandler delivers one event through a transaction on the outbox's own
// database (see Subscription.Tx). It must write only through tx: whatever
// it does elsewhere is not undone when the transaction rolls back.
type TxHandler func(ctx context.Context, tx DBTx, ev Event) error

// BatchError reports the outcome of each event of a batch: Errs[i] is the
// error of the i-th event, nil if it was delivered. A BatchHandler returns
// it when some events of a batch failed and others did not.
type BatchError struct {
	Errs []error
}

func (e *BatchError) Error() string {
	failed := 0
	var first error
	for _, err := range e.Errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if first == nil {
		return "outbox: batch: no event failed"
	}
	return fmt.Sprintf("outbox: batch: %d of %d events failed; first: %v", failed, len(e.Errs), first)
}

// Subscription is a named destination for events: its name is what the
// database records about it (what it has delivered, what failed, whether
// it is paused), so it must stay the same across deploys. Each
// subscription has its own delivery state: when one fails, only it
// retries, goes dead or is replayed; a subscription that succeeded never
// runs again for that event (unless the process died before its success
// was recorded: delivery is at least once).
//
// Zero option fields take the Config's value.
type Subscription struct {
	// Name identifies the subscription in the database: 1 to 100 ASCII
	// letters, digits, '.', '_' or '-', starting with a letter or digit.
	Name string
	// Types are the event types it takes; none means every type.
	Types []EventType
	// Handler delivers one event per call. Exactly one of Handler, Batch
	// and Tx must be set.
	Handler Handler
	// Batch delivers up to BatchSize events per call.
	Batch BatchHandler
	// Tx delivers one event by writing to the outbox's own database: the
	// engine opens a transaction there, the handler writes through it (a
	// projection, a read model, an inbox row), and the subscription's done
	// mark commits in the same transaction, so that the effect happens
	// exactly once, across crashes and lease takeovers. The handler itself
	// may run more than once for an event (its transaction failed, a
	// deadlock or a lost connection, and is tried again; or two instances
	// held the event at once after a lease ran out): only one of those
	// transactions commits, so what it does outside tx (calls, memory) is
	// not exactly once. The store must implement
	// driver.TxDeliveryStore (sqlstore does).
	Tx TxHandler

	// Order makes the subscription receive the events of one ordering key
	// (Envelope.Key) one at a time, in the order they were committed:
	// Ordered or OrderedSkipDead (see Order for the exact guarantee). The
	// store must implement driver.OrderedStore (sqlstore does). The
	// database records it with the subscription, so that instances that
	// publish without running it (an API in front of workers) number its
	// events too, once they have started.
	Order Order

	// Timeout bounds each call; its context is cancelled then, and a call
	// that ignores its context is abandoned and the attempt counts as
	// failed. Negative: no timeout. Defaults to Config.ListenerTimeout.
	Timeout time.Duration
	// MaxAttempts is the number of failed attempts after which an event is
	// dead for this subscription. Defaults to Config.MaxAttempts.
	MaxAttempts int
	// Retry computes the wait before the next attempt. Defaults to
	// Config.Retry.
	Retry RetryPolicy
	// Classify decides whether a failure is worth retrying. Defaults to
	// Config.Classify.
	Classify Classifier
	// Concurrency bounds the calls of this subscription running at once on
	// this instance. Defaults to Config.Workers for a Handler and 1 for a
	// Batch.
	Concurrency int
	// BatchSize is the most events per Batch call. Defaults to 100.
	BatchSize int
	// BatchLinger is how long a Batch call waits for more events before it
	// goes with fewer than BatchSize. Negative: no wait. Defaults to 5ms.
	BatchLinger time.Duration

	// CircuitThreshold is the number of consecutive Unavailable failures
	// after which the subscription's circuit opens: it stops taking events
	// (they wait in the table, attempts unchanged) and sends one probe
	// event at a time until one succeeds. Defaults to 5.
	CircuitThreshold int
	// CircuitProbe is the wait between probes while the circuit is open,
	// doubled after each failed probe up to CircuitMaxProbe, unless the
	// destination said when to come back (Unavailable's retry-after).
	// Defaults to 1s.
	CircuitProbe time.Duration
	// CircuitMaxProbe caps the wait between probes. Defaults to 30s.
	CircuitMaxProbe time.Duration

	// Rate limits the events delivered to the subscription on this
	// instance, in events a second (a fraction for fewer than one a
	// second); 0 means no limit. It holds for every path (the hot path,
	// the poller, retries) and counts each event of a Batch call. A
	// limited subscription never holds a worker while it waits for its
	// turn: a second's worth of its events waits in memory, the rest in
	// the table (deferred, attempts unchanged; an event that other
	// subscriptions took is split for that, many to a transaction). The
	// limit is per instance: N instances deliver up to N × Rate. See
	// docs/subscriptions.md.
	Rate float64
	// Burst is how many events may go at once after a quiet spell, above
	// Rate. It needs Rate. Defaults to Rate's events of 10ms, at least 1.
	Burst int

	// OnRetry is called after a failed attempt was recorded with another
	// to come, and OnDead after the last one was recorded (the delivery
	// is dead): for alerts, compensations and tickets. Each is called
	// after the write that records the outcome committed, never for a
	// success or for an attempt not spent (Unavailable with the circuit
	// open, a lease lost, Close); at most once per failure (a crash
	// between the write and the call, or a full queue, skips it:
	// Outbox.Dead is the complete list). Calls run on a goroutine of the
	// subscription's own, one at a time, and never hold up delivery: a
	// call that finds 1,024 calls of the subscription waiting is dropped,
	// logged and counted (Metrics.HookDropped). Each gets the
	// subscription's Timeout (Config.ListenerTimeout if it has none); a
	// panic is contained and logged. Close lets the queued calls run
	// while its context lasts.
	OnRetry FailureHook
	OnDead  FailureHook
}

// Defaults of the subscription options that do not come from Config.
const (
	DefaultBatchSize        = 100
	DefaultBatchLinger      = 5 * time.Millisecond
	DefaultCircuitThreshold = 5
	DefaultCircuitProbe     = time.Second
	DefaultCircuitMaxProbe  = 30 * time.Second
	// defaultBurstSpan is the default Burst's worth of Rate.
	defaultBurstSpan = 10 * time.Millisecond
	// MaxSubscriptionNameLen is the longest subscription name accepted.
	MaxSubscriptionNameLen = 100
)

// ErrStarted is returned by Subscribe after Start.
var ErrStarted = errors.New("outbox: Subscribe after Start: subscriptions are registered in the database when the engine starts; subscribe before calling Start")

// validSubscriptionName reports whether name can name a subscription.
func validSubscriptionName(name string) bool {
	if name == "" || len(name) > MaxSubscriptionNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// Subscribe adds a subscription. It must be called before Start: the
// engine registers its subscriptions in the database when it starts (so
// that every instance knows which destinations an event owes), and a set
// that changes while it runs would complete events for a set the others do
// not know. To add a subscription, deploy it: instances with the new set
// take part as they start, and events published from then on owe it.
func (o *Outbox) Subscribe(s Subscription) error {
	if err := s.validate(); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.started || o.starting || o.closed {
		return fmt.Errorf("%w (subscription %q)", ErrStarted, s.Name)
	}
	o.reg.mu.Lock()
	defer o.reg.mu.Unlock()
	reg := o.reg.load()
	if reg.byName[s.Name] != nil {
		return fmt.Errorf("outbox: Subscribe: a subscription named %q exists already; names must be unique", s.Name)
	}
	if _, ok := o.store.(driver.OrderedStore); s.Order != Unordered && !ok {
		return errNoOrderedStore(o.store)
	}
	if _, ok := o.store.(driver.TxDeliveryStore); s.Tx != nil && !ok {
		return fmt.Errorf("outbox: subscription %q has a Tx handler, but the store (%T) cannot run one: it does not implement driver.TxDeliveryStore", s.Name, o.store)
	}
	sub := newSubscription(s, o.cfg)
	o.reg.cur.Store(reg.with(sub))
	return nil
}

// Handle subscribes h under name to events of the given types (none: every
// type), with the Config's options. Like http.ServeMux.Handle, it panics
// on a programmer error: an invalid or repeated name, a nil handler, or a
// call after Start.
func (o *Outbox) Handle(name string, h Handler, types ...EventType) {
	if err := o.Subscribe(Subscription{Name: name, Types: types, Handler: h}); err != nil {
		panic(err)
	}
}

func (s *Subscription) validate() error {
	if !validSubscriptionName(s.Name) {
		return fmt.Errorf("outbox: subscription name %q is invalid: use 1 to %d ASCII letters, digits, '.', '_' or '-', starting with a letter or digit", s.Name, MaxSubscriptionNameLen)
	}
	set := 0
	for _, ok := range []bool{s.Handler != nil, s.Batch != nil, s.Tx != nil} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return fmt.Errorf("outbox: subscription %q: set exactly one of Handler, Batch and Tx", s.Name)
	}
	for _, t := range s.Types {
		if t == "" || len(t) > MaxTypeLen {
			return fmt.Errorf("outbox: subscription %q: event type %q is invalid: 1 to %d bytes", s.Name, t, MaxTypeLen)
		}
	}
	var errs []error
	if s.Order < Unordered || s.Order > OrderedSkipDead {
		errs = append(errs, fmt.Errorf("outbox: subscription %q: Order %d is unknown: use Unordered, Ordered or OrderedSkipDead", s.Name, s.Order))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"MaxAttempts", s.MaxAttempts}, {"Concurrency", s.Concurrency}, {"BatchSize", s.BatchSize}, {"CircuitThreshold", s.CircuitThreshold}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("outbox: subscription %q: %s is %d; it must be positive, or 0 for the default", s.Name, f.name, f.v))
		}
	}
	if err := s.validateRate(); err != nil {
		errs = append(errs, err)
	}
	if s.CircuitProbe < 0 || s.CircuitMaxProbe < 0 {
		errs = append(errs, fmt.Errorf("outbox: subscription %q: CircuitProbe and CircuitMaxProbe must be positive, or 0 for the default", s.Name))
	}
	return errors.Join(errs...)
}

// MaxRate is the highest Subscription.Rate accepted, in events a second.
const MaxRate = 1e6

// validateRate checks Rate and Burst.
func (s *Subscription) validateRate() error {
	switch {
	case math.IsNaN(s.Rate) || s.Rate < 0 || s.Rate > MaxRate:
		return fmt.Errorf("outbox: subscription %q: Rate is %v; it must be between 0 (no limit) and %v events a second", s.Name, s.Rate, float64(MaxRate))
	case s.Burst < 0:
		return fmt.Errorf("outbox: subscription %q: Burst is %d; it must be positive, or 0 for the default", s.Name, s.Burst)
	case s.Burst > 0 && s.Rate == 0:
		return fmt.Errorf("outbox: subscription %q: Burst is %d but Rate is 0 (no limit); set Rate, or leave Burst 0", s.Name, s.Burst)
	case s.Burst > maxGateHold:
		return fmt.Errorf("outbox: subscription %q: Burst is %d; it must be at most %d", s.Name, s.Burst, maxGateHold)
	}
	return nil
}

// subscription is a Subscription with its defaults and its runtime state
// on this instance.
type subscription struct {
	Subscription
	all     bool // takes every type
	sem     chan struct{}
	circuit circuit
	batch   *batcher // nil for a Handler
	gate    *gate    // nil without a Rate
}

func newSubscription(s Subscription, cfg Config) *subscription {
	s.Types = slices.Clone(s.Types)
	s.Timeout = cmpOrDur(s.Timeout, cfg.ListenerTimeout)
	s.MaxAttempts = cmpOrInt(s.MaxAttempts, cfg.MaxAttempts)
	if s.Retry == nil {
		s.Retry = cfg.Retry
	}
	if s.Classify == nil {
		s.Classify = cfg.Classify
	}
	if s.Batch != nil {
		s.Concurrency = cmpOrInt(s.Concurrency, 1)
	} else {
		s.Concurrency = cmpOrInt(s.Concurrency, cfg.Workers)
	}
	if s.Rate > 0 {
		s.Burst = cmpOrInt(s.Burst, max(1, int(s.Rate*defaultBurstSpan.Seconds())))
	}
	s.BatchSize = cmpOrInt(s.BatchSize, DefaultBatchSize)
	s.BatchLinger = cmpOrDur(s.BatchLinger, DefaultBatchLinger)
	s.CircuitThreshold = cmpOrInt(s.CircuitThreshold, DefaultCircuitThreshold)
	s.CircuitProbe = cmpOrDur(s.CircuitProbe, DefaultCircuitProbe)
	s.CircuitMaxProbe = max(cmpOrDur(s.CircuitMaxProbe, DefaultCircuitMaxProbe), s.CircuitProbe)
	sub := &subscription{Subscription: s, all: len(s.Types) == 0, sem: make(chan struct{}, s.Concurrency)}
	sub.circuit.cfg = &sub.Subscription
	return sub
}

func cmpOrInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func cmpOrDur(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}

func (s *subscription) takes(t EventType) bool { return s.all || slices.Contains(s.Types, t) }
