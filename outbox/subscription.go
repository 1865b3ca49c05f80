package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
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

// DBTx is an open transaction on the outbox's database, as a TxHandler
// gets it; *sql.Tx satisfies it.
type DBTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

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
	// exactly once, across crashes and lease takeovers. The store must
	// implement TxDeliveryStore (sqlstore does).
	Tx TxHandler

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
}

// Defaults of the subscription options that do not come from Config.
const (
	DefaultBatchSize        = 100
	DefaultBatchLinger      = 5 * time.Millisecond
	DefaultCircuitThreshold = 5
	DefaultCircuitProbe     = time.Second
	DefaultCircuitMaxProbe  = 30 * time.Second
	// MaxSubscriptionNameLen is the longest subscription name accepted.
	MaxSubscriptionNameLen = 100
)

// ErrStarted is returned by Subscribe after Start.
var ErrStarted = errors.New("outbox: Subscribe after Start: subscriptions are registered in the database when the engine starts; subscribe before calling Start")

// ValidSubscriptionName reports whether name can name a subscription.
func ValidSubscriptionName(name string) bool {
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
	if o.started || o.closed {
		return fmt.Errorf("%w (subscription %q)", ErrStarted, s.Name)
	}
	o.regMu.Lock()
	defer o.regMu.Unlock()
	reg := o.subs.Load()
	if reg.byName[s.Name] != nil {
		return fmt.Errorf("outbox: Subscribe: a subscription named %q exists already; names must be unique", s.Name)
	}
	if _, ok := o.store.(TxDeliveryStore); s.Tx != nil && !ok {
		return fmt.Errorf("outbox: subscription %q has a Tx handler, but the store (%T) cannot run one: it does not implement outbox.TxDeliveryStore", s.Name, o.store)
	}
	sub := newSubscription(s, o.cfg)
	o.subs.Store(reg.with(sub))
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
	if !ValidSubscriptionName(s.Name) {
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
	for _, f := range []struct {
		name string
		v    int
	}{{"MaxAttempts", s.MaxAttempts}, {"Concurrency", s.Concurrency}, {"BatchSize", s.BatchSize}, {"CircuitThreshold", s.CircuitThreshold}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("outbox: subscription %q: %s is %d; it must be positive, or 0 for the default", s.Name, f.name, f.v))
		}
	}
	if s.CircuitProbe < 0 || s.CircuitMaxProbe < 0 {
		errs = append(errs, fmt.Errorf("outbox: subscription %q: CircuitProbe and CircuitMaxProbe must be positive, or 0 for the default", s.Name))
	}
	return errors.Join(errs...)
}

// subscription is a Subscription with its defaults and its runtime state
// on this instance.
type subscription struct {
	Subscription
	all     bool // takes every type
	sem     chan struct{}
	circuit circuit
	batch   *batcher // nil for a Handler
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

// registry is an immutable view of the subscriptions: this instance's own
// and what the database says of every instance's (remote ones, paused
// ones). It is replaced as a whole.
type registry struct {
	local  []*subscription
	byName map[string]*subscription
	byType map[EventType][]*subscription
	all    []*subscription

	// From the database, refreshed every PollInterval.
	remote map[string][]EventType // subscriptions of other instances only; nil types: all
	paused map[string]bool
}

func (r *registry) with(s *subscription) *registry {
	n := &registry{
		local:  append(slices.Clone(r.local), s),
		byName: make(map[string]*subscription, len(r.byName)+1),
		remote: r.remote,
		paused: r.paused,
	}
	for k, v := range r.byName {
		n.byName[k] = v
	}
	n.byName[s.Name] = s
	n.index()
	return n
}

func (r *registry) index() {
	r.byType = map[EventType][]*subscription{}
	r.all = nil
	for _, s := range r.local {
		if s.all {
			r.all = append(r.all, s)
			continue
		}
		for _, t := range s.Types {
			if !slices.Contains(r.byType[t], s) {
				r.byType[t] = append(r.byType[t], s)
			}
		}
	}
}

// has reports whether a subscription of this instance takes type t.
func (r *registry) has(t EventType) bool { return len(r.all) > 0 || len(r.byType[t]) > 0 }

// match returns this instance's subscriptions for type t.
func (r *registry) match(t EventType) []*subscription {
	typed := r.byType[t]
	if len(r.all) == 0 {
		return typed
	}
	if len(typed) == 0 {
		return r.all
	}
	return append(append(make([]*subscription, 0, len(typed)+len(r.all)), typed...), r.all...)
}

// owedElsewhere returns the names of the subscriptions of other instances
// that take type t: an event of type t is complete only once they have it
// too.
func (r *registry) owedElsewhere(t EventType) []string {
	var names []string
	for name, types := range r.remote {
		if types == nil || slices.Contains(types, t) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// names returns the names of this instance's subscriptions that are not
// paused, for the delivery claim.
func (r *registry) claimable() []string {
	names := make([]string, 0, len(r.local))
	for _, s := range r.local {
		if !r.paused[s.Name] && s.circuit.mayClaim() {
			names = append(names, s.Name)
		}
	}
	return names
}

// --- circuit ---

// unavailableError marks a destination outage.
type unavailableError struct {
	err        error
	retryAfter time.Duration
}

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as an outage of the destination rather than a
// problem of the event: the attempt is not counted, the event is tried
// again later, and after CircuitThreshold such failures in a row the
// subscription's circuit opens (see Subscription). retryAfter, if
// positive, is when the destination said to come back (an HTTP 429 or 503
// Retry-After); otherwise the circuit's own probe interval applies.
func Unavailable(err error, retryAfter time.Duration) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err, retryAfter: retryAfter}
}

// IsUnavailable reports whether err was marked with Unavailable, and the
// retry-after it carries.
func IsUnavailable(err error) (bool, time.Duration) {
	var u *unavailableError
	if errors.As(err, &u) {
		return true, u.retryAfter
	}
	return false, 0
}

// CircuitState is the state of a subscription's circuit on one instance.
type CircuitState string

const (
	CircuitClosed   CircuitState = "closed"    // delivering
	CircuitOpen     CircuitState = "open"      // waiting for the next probe
	CircuitHalfOpen CircuitState = "half-open" // one probe event in flight
)

// circuit is a subscription's breaker on this instance.
type circuit struct {
	cfg *Subscription

	mu        sync.Mutex
	failures  int // consecutive Unavailable failures
	open      bool
	probing   bool // a probe is in flight
	until     time.Time
	nextProbe time.Duration // wait after the next failed probe
}

// acquire reports whether an event may go to the destination now. While
// the circuit is open, only one probe at a time may, once the wait is
// over; probe is then true and the caller must report the outcome. wait
// is how long to defer the event otherwise.
func (c *circuit) acquire(now time.Time) (ok, probe bool, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.open {
		return true, false, 0
	}
	if c.probing || now.Before(c.until) {
		return false, false, max(c.until.Sub(now), c.cfg.CircuitProbe)
	}
	c.probing = true
	return true, true, 0
}

// mayClaim reports whether the poller should claim this subscription's
// deliveries: not while the circuit is open and no probe is due.
func (c *circuit) mayClaim() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.open || (!c.probing && !time.Now().Before(c.until))
}

// success closes the circuit.
func (c *circuit) success() (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen = c.open
	c.failures, c.open, c.probing, c.nextProbe = 0, false, false, 0
	return wasOpen
}

// failure records an attempt that failed for a reason other than an
// outage: the destination answered, so it counts as up.
func (c *circuit) failure(probe bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = 0
	if probe || c.open {
		c.open, c.probing, c.nextProbe = false, false, 0
	}
}

// unavailable records an outage and returns how long to defer the event
// and whether the circuit just opened.
func (c *circuit) unavailable(now time.Time, retryAfter time.Duration, probe bool) (wait time.Duration, opened bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	if probe {
		c.probing = false
	}
	if !c.open && c.failures < c.cfg.CircuitThreshold {
		return max(retryAfter, c.cfg.CircuitProbe), false
	}
	if !c.open {
		opened = true
		c.open = true
		c.nextProbe = c.cfg.CircuitProbe
	} else if probe {
		c.nextProbe = min(2*c.nextProbe, c.cfg.CircuitMaxProbe)
	}
	wait = c.nextProbe
	if retryAfter > 0 {
		wait = retryAfter
	}
	if t := now.Add(wait); t.After(c.until) {
		c.until = t
	}
	return c.until.Sub(now), opened
}

// release gives up a probe that was not sent (the event went elsewhere).
func (c *circuit) release(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	c.probing = false
	c.mu.Unlock()
}

// state returns the circuit's state for metrics and tools.
func (c *circuit) state() CircuitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.open:
		return CircuitClosed
	case c.probing:
		return CircuitHalfOpen
	}
	return CircuitOpen
}

// --- the cluster's view ---

// syncRegistry registers this instance's subscriptions and learns the
// others' and which are paused.
func (o *Outbox) syncRegistry(ctx context.Context) error {
	cur := o.subs.Load()
	infos := make([]SubscriptionInfo, len(cur.local))
	for i, s := range cur.local {
		infos[i] = SubscriptionInfo{Name: s.Name, Types: s.Types}
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	states, err := o.dstore.SyncSubscriptions(ctx, infos)
	if err != nil {
		return err
	}
	o.applyStates(states)
	return nil
}

// applyStates replaces the database's part of the registry.
func (o *Outbox) applyStates(states []SubscriptionState) {
	o.regMu.Lock()
	defer o.regMu.Unlock()
	cur := o.subs.Load()
	next := &registry{local: cur.local, byName: cur.byName, byType: cur.byType, all: cur.all,
		remote: map[string][]EventType{}, paused: map[string]bool{}}
	for _, st := range states {
		if st.Paused {
			next.paused[st.Name] = true
		}
		if cur.byName[st.Name] != nil || st.Idle > o.cfg.SubscriptionExpiry {
			continue
		}
		next.remote[st.Name] = st.Types
	}
	for name := range cur.paused {
		if !next.paused[name] && cur.byName[name] != nil {
			o.log.Info("subscription resumed", slog.String("subscription", name))
		}
	}
	for name := range next.paused {
		if !cur.paused[name] && cur.byName[name] != nil {
			o.log.Info("subscription paused: its events wait", slog.String("subscription", name))
		}
	}
	o.subs.Store(next)
}

// registryLoop refreshes the registry every PollInterval.
func (o *Outbox) registryLoop(ctx context.Context) {
	t := time.NewTicker(o.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := o.syncRegistry(ctx); err != nil && ctx.Err() == nil {
			o.log.Error("refresh the subscriptions from the database", slog.Any("error", err))
		}
	}
}

// Pause stops the delivery of a subscription on every instance sharing
// the table (each obeys within its PollInterval; this one at once): its
// events wait, attempts unchanged, while the other subscriptions go on.
func (o *Outbox) Pause(ctx context.Context, name string) error { return o.setPaused(ctx, name, true) }

// Resume undoes Pause.
func (o *Outbox) Resume(ctx context.Context, name string) error {
	if err := o.setPaused(ctx, name, false); err != nil {
		return err
	}
	o.wakePoller()
	return nil
}

func (o *Outbox) setPaused(ctx context.Context, name string, paused bool) error {
	known, err := o.dstore.SetPaused(ctx, name, paused)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("outbox: no subscription named %q is registered (subscriptions are registered when an instance that has them starts)", name)
	}
	return o.syncRegistry(ctx)
}

// CircuitStates returns the state of each subscription's circuit on this
// instance.
func (o *Outbox) CircuitStates() map[string]CircuitState {
	m := map[string]CircuitState{}
	for _, s := range o.subs.Load().local {
		m[s.Name] = s.circuit.state()
	}
	return m
}

// SubscriptionStatus is a subscription as this instance sees it.
type SubscriptionStatus struct {
	Name string
	// Types are the event types it takes; nil: every type.
	Types []EventType
	// Local is set for this instance's own subscriptions; the others are
	// registered in the database by other instances.
	Local bool
	// Paused is the cluster-wide pause, as of the last refresh.
	Paused bool
	// Circuit is the state of its circuit here (local ones only).
	Circuit CircuitState
}

// Subscriptions returns the subscriptions this instance knows, its own
// first, then the others registered in the database, each in name order.
func (o *Outbox) Subscriptions() []SubscriptionStatus {
	reg := o.subs.Load()
	var out []SubscriptionStatus
	for _, s := range reg.local {
		out = append(out, SubscriptionStatus{Name: s.Name, Types: slices.Clone(s.Types), Local: true, Paused: reg.paused[s.Name], Circuit: s.circuit.state()})
	}
	slices.SortFunc(out, func(a, b SubscriptionStatus) int { return strings.Compare(a.Name, b.Name) })
	var remote []SubscriptionStatus
	for name, types := range reg.remote {
		remote = append(remote, SubscriptionStatus{Name: name, Types: slices.Clone(types), Paused: reg.paused[name]})
	}
	slices.SortFunc(remote, func(a, b SubscriptionStatus) int { return strings.Compare(a.Name, b.Name) })
	return append(out, remote...)
}

// Lag returns, for every subscription this instance knows (its own and
// those other instances registered), what it has not delivered yet. The
// store must implement OperatorStore (sqlstore does).
func (o *Outbox) Lag(ctx context.Context) ([]Lag, error) {
	os, ok := o.store.(OperatorStore)
	if !ok {
		return nil, fmt.Errorf("outbox: Lag: the store (%T) does not implement outbox.OperatorStore", o.store)
	}
	var infos []SubscriptionInfo
	for _, s := range o.Subscriptions() {
		infos = append(infos, SubscriptionInfo{Name: s.Name, Types: s.Types})
	}
	return os.Lag(ctx, infos)
}
