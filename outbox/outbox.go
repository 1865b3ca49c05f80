package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Errors returned by Publish and the lifecycle methods.
var (
	// ErrNoTx is returned by Publish when ctx carries no transaction.
	ErrNoTx = errors.New("outbox: no transaction in context; wrap the handler with txmw.Transactional (or an adapter's middleware), or use PublishTx")

	// ErrNoOutbox is returned by the package-level Publish when neither ctx
	// nor the package default carries an *Outbox.
	ErrNoOutbox = errors.New("outbox: no outbox in context and no default; call outbox.SetDefault(ob), or use ob.Publish")
	// ErrClosed is returned by Start after Close.
	ErrClosed = errors.New("outbox: closed")
)

// Event is what a handler receives: the published envelope plus delivery
// facts.
type Event struct {
	Envelope
	// Attempt is 1 on the first delivery and grows with each retry (of
	// this subscription).
	Attempt int
	// Path says whether the event came on the hot path or from the poller.
	Path Path
	// Subscription is the name of the subscription being delivered to.
	Subscription string
}

// Outbox is the engine: it writes events through the caller's transaction
// and, after commit, delivers them to listeners, with a poller that catches
// whatever the fast path missed. All methods are safe for concurrent use.
type Outbox struct {
	store driver.Store
	cfg   Config
	log   *slog.Logger
	m     Metrics

	dstore driver.DeliveryStore
	regMu  sync.Mutex // serialises changes of subs
	subs   atomic.Pointer[registry]

	warnedUnstarted atomic.Bool // "published before Start" was logged

	noListenerMu  sync.Mutex
	noListenerLog map[EventType]time.Time // last warning per type

	hot, cold chan *item
	inflight  inflightSet
	comp      *completer
	health    health
	leases    *leaseKeeper
	dropped   chan string    // ids dropped from a full hot queue, for the poller to release
	nudge     chan struct{}  // wakes the poller; capacity 1
	retryDue  chan time.Time // due times of retries scheduled here, for the poller
	coldSpace chan struct{}  // a worker took a cold item; capacity 1

	mu        sync.RWMutex // guards the state below; RLock on the hot path
	started   bool
	closed    bool
	closeDone chan struct{}
	cancelRun context.CancelFunc
	stopPoll  context.CancelFunc
	draining  chan struct{}

	workers    sync.WaitGroup
	poller     sync.WaitGroup
	batchers   sync.WaitGroup
	background sync.WaitGroup // lease renewer, sampler
	stragglers sync.WaitGroup // listener calls, including those abandoned after their timeout
	running    atomic.Int64   // listener calls not yet returned
}

// New returns an Outbox over store. It does not start delivering until
// Start; Publish works at once.
func New(store driver.Store, cfg Config) (*Outbox, error) {
	if store == nil {
		return nil, errors.New("outbox: New: store is nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if _, ok := store.(driver.Cleaner); cfg.Retention > 0 && !ok {
		return nil, fmt.Errorf("outbox: Config.Retention is set but the store (%T) cannot delete rows: it does not implement driver.Cleaner", store)
	}
	ds, ok := store.(driver.DeliveryStore)
	if !ok {
		return nil, fmt.Errorf("outbox: New: the store (%T) keeps no per-subscription delivery state: it must implement driver.DeliveryStore (sqlstore and outboxtest do)", store)
	}
	cfg = cfg.withDefaults()
	o := &Outbox{
		store:     store,
		dstore:    ds,
		cfg:       cfg,
		log:       cfg.Logger.With(slog.String("component", "outbox"), slog.String("instance", cfg.InstanceID)),
		m:         cfg.Metrics,
		hot:       make(chan *item, cfg.HotQueueSize),
		cold:      make(chan *item, cfg.ColdQueueSize),
		inflight:  inflightSet{m: make(map[string]struct{})},
		dropped:   make(chan string, max(10*cfg.HotQueueSize, 10000)),
		nudge:     make(chan struct{}, 1),
		retryDue:  make(chan time.Time, 1024),
		coldSpace: make(chan struct{}, 1),
		closeDone: make(chan struct{}),
		draining:  make(chan struct{}),

		noListenerLog: map[EventType]time.Time{},
	}
	reg := &registry{byName: map[string]*subscription{}}
	reg.index()
	o.subs.Store(reg)
	o.comp = newCompleter(o)
	o.leases = newLeaseKeeper(o)
	return o, nil
}

// InstanceID returns the id this instance claims events under.
func (o *Outbox) InstanceID() string { return o.cfg.InstanceID }

// Config returns the configuration in force, defaults filled in.
func (o *Outbox) Config() Config { return o.cfg }

// --- publishing ---

// Publish writes env through the transaction carried by ctx and, once that
// transaction commits, hands it to the dispatcher. It returns the event's
// id. Without a transaction in ctx it fails with ErrNoTx and writes
// nothing; an invalid envelope fails with a *ValidationError.
func (o *Outbox) Publish(ctx context.Context, env Envelope) (string, error) {
	tx, ok := TxFromContext(ctx)
	if !ok {
		return "", noTxError(ctx)
	}
	return o.PublishTx(ctx, tx, env)
}

// PublishTx is Publish with the transaction given explicitly.
func (o *Outbox) PublishTx(ctx context.Context, tx TxContext, env Envelope) (string, error) {
	if tx == nil {
		return "", ErrNoTx
	}
	row, env, err := encode(env, time.Now())
	if err != nil {
		return "", err
	}
	if err := o.write(ctx, tx, []driver.Row{row}, []Envelope{env}); err != nil {
		return "", err
	}
	return env.ID, nil
}

// PublishAll writes envs through the transaction carried by ctx, in one
// statement per few hundred events when the store is a BatchInserter, and
// hands them to the dispatcher once that transaction commits. It returns
// their ids in order. Every envelope is validated first: if one is invalid,
// the error names its index and nothing is written.
func (o *Outbox) PublishAll(ctx context.Context, envs ...Envelope) ([]string, error) {
	tx, ok := TxFromContext(ctx)
	if !ok {
		return nil, noTxError(ctx)
	}
	return o.PublishAllTx(ctx, tx, envs...)
}

// PublishAllTx is PublishAll with the transaction given explicitly.
func (o *Outbox) PublishAllTx(ctx context.Context, tx TxContext, envs ...Envelope) ([]string, error) {
	if tx == nil {
		return nil, ErrNoTx
	}
	if len(envs) == 0 {
		return nil, nil
	}
	now := time.Now()
	rows := make([]driver.Row, len(envs))
	encoded := make([]Envelope, len(envs))
	for i, env := range envs {
		row, env, err := encode(env, now)
		if err != nil {
			return nil, fmt.Errorf("outbox: envelope %d of %d: %w", i, len(envs), err)
		}
		rows[i], encoded[i] = row, env
	}
	if err := o.write(ctx, tx, rows, encoded); err != nil {
		return nil, err
	}
	ids := make([]string, len(encoded))
	for i, env := range encoded {
		ids[i] = env.ID
	}
	return ids, nil
}

// write inserts the rows of validated envelopes through tx and registers
// the hand-over to the dispatcher after commit of those this instance will
// deliver itself. Only those are written leased to this instance: an event
// whose type no subscription here takes, or published with the hot path off or
// through a closed outbox, is written free, so that any instance's poller
// can take it at once.
func (o *Outbox) write(ctx context.Context, tx TxContext, rows []driver.Row, envs []Envelope) error {
	o.mu.RLock()
	closed := o.closed
	o.mu.RUnlock()
	hot := !o.cfg.DisableHotPath && !closed
	reg := o.subs.Load()
	var mine []Envelope
	var mineRows, freeRows []driver.Row
	for i, env := range envs {
		if hot && reg.has(env.Type) {
			mine = append(mine, env)
			mineRows = append(mineRows, rows[i])
		} else {
			freeRows = append(freeRows, rows[i])
		}
	}
	written := time.Now() // before the INSERT: never later than the lease's start
	if err := o.insert(ctx, tx, mineRows, o.cfg.InstanceID, o.cfg.Lease); err != nil {
		return err
	}
	if err := o.insert(ctx, tx, freeRows, "", 0); err != nil {
		return err
	}
	for _, env := range envs {
		o.m.Published(env.Type)
	}
	if len(mine) > 0 {
		tx.AfterCommit(func() {
			for _, env := range mine {
				o.enqueueHot(env, written)
			}
		})
	}
	return nil
}

func (o *Outbox) insert(ctx context.Context, tx TxContext, rows []driver.Row, owner string, lease time.Duration) error {
	if bi, ok := o.store.(driver.BatchInserter); ok && len(rows) > 1 {
		if err := bi.InsertBatch(ctx, tx, rows, owner, lease); err != nil {
			return fmt.Errorf("outbox: insert %d events (first %s): %w", len(rows), rows[0].ID, err)
		}
		return nil
	}
	for i := range rows {
		if err := o.store.Insert(ctx, tx, &rows[i], owner, lease); err != nil {
			return fmt.Errorf("outbox: insert event %s: %w", rows[i].ID, err)
		}
	}
	return nil
}

// enqueueHot hands a committed event to the dispatcher. It never blocks: a
// full queue leaves the event to the poller.
//
// The row's lease started when it was written. If the transaction committed
// so late that the lease may run out before the renewer extends it (more
// than Lease/2 after the write), another instance may already be entitled
// to the event: the hot path stays out and a poller takes it once the
// lease has ended (at most Lease/2 later), so that a slow transaction does
// not cause a second delivery.
func (o *Outbox) enqueueHot(env Envelope, written time.Time) {
	it := &item{env: env, path: PathHot, since: time.Now()}
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.closed {
		// The row is leased to this instance, which will not deliver it:
		// give it back so that another instance takes it at once instead
		// of after the lease.
		o.handBackLate(env.ID)
		return
	}
	if !o.started && o.warnedUnstarted.CompareAndSwap(false, true) {
		o.log.Warn("events are published but the outbox is not started: they wait in memory until Start (call ob.Start(ctx) at startup)",
			slog.String("event_id", env.ID))
	}
	if age := it.since.Sub(written); age > o.cfg.Lease/2 {
		// Not released early either: this instance's poller may already
		// have claimed the row, and a release would take it back from
		// under that delivery. A poller takes it when the lease ends.
		o.m.HotDropped()
		o.log.Warn("transaction committed late: its lease may have run out; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)),
			slog.Duration("since_written", age), slog.Duration("lease", o.cfg.Lease))
		return
	}
	if !o.inflight.acquire(env.ID) {
		return
	}
	select {
	case o.hot <- it:
		o.m.HotEnqueued()
	default:
		o.inflight.release(env.ID)
		// The row is leased to this instance from its insert, freshly:
		// no poller can have claimed it. Ask the poller to release it so
		// that it is due at once; if even that list is full, the lease
		// runs out by itself.
		select {
		case o.dropped <- env.ID:
		default:
			o.log.Warn("overflow list full too: event waits for its lease to expire",
				slog.String("event_id", env.ID), slog.Duration("lease", o.cfg.Lease))
		}
		o.m.HotDropped()
		o.log.Warn("hot queue full; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)), slog.Int("capacity", cap(o.hot)))
		o.wakePoller()
	}
}

// handBackLate releases the lease of an event committed after Close
// began, unless this instance still has it in hand.
func (o *Outbox) handBackLate(id string) {
	if o.inflight.has(id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	o.releaseLeases(ctx, []string{id}, "release an event committed after close")
	o.log.Debug("outbox closed; event committed after close handed back to the table", slog.String("event_id", id))
}

// noListener counts an event this instance has no listener for and logs
// it at most once a minute per event type.
func (o *Outbox) noListener(id string, t EventType) {
	o.m.NoListener(t)
	now := time.Now()
	o.noListenerMu.Lock()
	last, seen := o.noListenerLog[t]
	log := !seen || now.Sub(last) >= time.Minute
	if log {
		o.noListenerLog[t] = now
	}
	o.noListenerMu.Unlock()
	if log {
		o.log.Warn("no listener here for this event type: handed back for an instance that has one (logged once a minute per type)",
			slog.String("event_id", id), slog.String("event_type", string(t)), slog.Duration("retry_in", o.cfg.NoListenerDelay))
	}
}

func (o *Outbox) wakePoller() {
	select {
	case o.nudge <- struct{}{}:
	default:
	}
}

// --- default outbox ---

var defaultOutbox atomic.Pointer[Outbox]

// SetDefault makes o the outbox used by the package-level Publish when ctx
// carries none. Passing nil clears it.
func SetDefault(o *Outbox) { defaultOutbox.Store(o) }

// Default returns the outbox set with SetDefault, or nil.
func Default() *Outbox { return defaultOutbox.Load() }

type outboxKey struct{}

// NewContext returns a copy of ctx that carries o for the package-level
// Publish; it takes precedence over the default.
func NewContext(ctx context.Context, o *Outbox) context.Context {
	return context.WithValue(ctx, outboxKey{}, o)
}

// FromContext returns the outbox for ctx: the one NewContext put there, or
// else the default. It returns nil if there is neither.
func FromContext(ctx context.Context) *Outbox {
	if o, ok := ctx.Value(outboxKey{}).(*Outbox); ok && o != nil {
		return o
	}
	return Default()
}

// Publish writes env through the transaction carried by ctx, with the
// outbox FromContext finds. It is the call HTTP handlers make:
//
//	outbox.Publish(r.Context(), outbox.Envelope{Type: OrderPlaced, JSON: body})
func Publish(ctx context.Context, env Envelope) (string, error) {
	o := FromContext(ctx)
	if o == nil {
		return "", ErrNoOutbox
	}
	return o.Publish(ctx, env)
}

// PublishAll is Publish for several events at once (see Outbox.PublishAll),
// with the outbox found the same way.
func PublishAll(ctx context.Context, envs ...Envelope) ([]string, error) {
	o := FromContext(ctx)
	if o == nil {
		return nil, ErrNoOutbox
	}
	return o.PublishAll(ctx, envs...)
}

// --- in-flight set ---

// inflightSet holds the ids this instance has queued or is delivering, so
// that the hot path and the poller never run one event twice at once, and
// so that the lease renewer knows what to renew.
type inflightSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (s *inflightSet) acquire(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return false
	}
	s.m[id] = struct{}{}
	return true
}

func (s *inflightSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

func (s *inflightSet) release(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

func (s *inflightSet) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.m))
	for id := range s.m {
		ids = append(ids, id)
	}
	return ids
}
