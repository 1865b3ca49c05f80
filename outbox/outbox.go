package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/txctx"
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
// and, after commit, delivers them to subscriptions, with a poller that
// catches whatever the fast path missed. All methods are safe for
// concurrent use.
//
// It wires parts that each own their state and goroutines: the registrar
// (subscriptions, in memory and in the database), the dispatcher (queues,
// workers, batchers), the poller, the completer (batched DONE writes), the
// lease keeper, the sampler (metrics) and the cleaner (retention).
type Outbox struct {
	*deps
	reg     *registrar
	disp    *dispatcher
	poller  *poller
	comp    *completer
	hooks   *hooks
	leases  *leaseKeeper
	sampler *sampler
	cleaner *cleaner
	seq     *sequencer

	warnedUnstarted atomic.Bool // "published before Start" was logged

	// startMu lets one Start run at a time. Start holds mu only to read
	// and change the lifecycle, never across its database write: Publish
	// read-locks mu inside the application's transaction, which may hold
	// the very lock that write waits for (SQLite has one writer).
	startMu   sync.Mutex
	mu        sync.RWMutex // guards the lifecycle below; RLock on the hot path
	starting  bool         // Start is registering the subscriptions
	started   bool
	closed    bool
	closeDone chan struct{}
	// stopWatch stops the watch on Start's context (set by Start, called
	// by Close): a cancellation after Close is no news.
	stopWatch func() bool
}

// deps are what every part of the engine shares; they never change after
// New.
type deps struct {
	store  driver.Store
	dstore driver.DeliveryStore
	cfg    Config
	log    *slog.Logger
	m      Metrics
	health *health

	// life bounds the engine's own writes (storeCtx) and the contexts of
	// its parts: it ends closeGrace after Close's context, so that Close
	// returns in time even when the database does not answer.
	life    context.Context
	endLife context.CancelFunc
	// patience ends closeGrace after life: Close stops waiting then for
	// a part that has not returned (see runner.stop).
	patience context.Context
	endWait  context.CancelFunc
}

// storeCtx returns the context of one of the engine's own writes: at most
// storeTimeout, and no later than the engine's life.
func (d *deps) storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(d.life, storeTimeout)
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
	if _, ok := store.(driver.Archiver); cfg.ArchiveRetention > 0 && !ok {
		return nil, fmt.Errorf("outbox: Config.ArchiveRetention is set but the store (%T) keeps no archive: it does not implement driver.Archiver (sqlstore does); unset ArchiveRetention", store)
	}
	ds, ok := store.(driver.DeliveryStore)
	if !ok {
		return nil, fmt.Errorf("outbox: New: the store (%T) keeps no per-subscription delivery state: it must implement driver.DeliveryStore (sqlstore and outboxtest do)", store)
	}
	cfg = cfg.withDefaults()
	d := &deps{
		store:  store,
		dstore: ds,
		cfg:    cfg,
		log:    cfg.Logger.With(slog.String("component", "outbox"), slog.String("instance", cfg.InstanceID)),
		m:      cfg.Metrics,
		health: &health{},
	}
	d.life, d.endLife = context.WithCancel(context.Background())
	d.patience, d.endWait = context.WithCancel(context.Background())
	o := &Outbox{deps: d, closeDone: make(chan struct{})}
	o.reg = newRegistrar(d)
	o.disp = newDispatcher(d)
	o.hooks = newHooks(o.log, o.m)
	o.poller = newPoller(d)
	o.leases = newLeaseKeeper(d)
	o.comp = newCompleter(d, o.leases)
	o.sampler = &sampler{deps: d, disp: o.disp, lag: o.Lag}
	o.cleaner = &cleaner{deps: d}
	o.seq = newSequencer(d)
	sig := &signals{reg: o.reg, ordered: o.seq.ostore != nil, nudge: o.poller.nudge, retryDue: o.poller.retryDue, missed: o.poller.missed, dropped: o.poller.dropped, keys: o.seq.keys}
	o.seq.disp, o.seq.comp, o.seq.sig, o.seq.reg = o.disp, o.comp, sig, o.reg
	o.poller.seq = o.seq
	o.comp.sig, o.comp.ostore, o.comp.reg = sig, o.seq.ostore, o.reg
	o.comp.refused, o.comp.dispatcherDone = o.disp.refused, o.disp.chainsDone
	o.comp.deferred = o.disp.recordDeferrals
	o.disp.reg, o.disp.comp, o.disp.leases, o.disp.sig, o.disp.hooks = o.reg, o.comp, o.leases, sig, o.hooks
	o.poller.disp, o.poller.reg, o.poller.leases = o.disp, o.reg, o.leases
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
	tx, ok := txctx.From(ctx)
	if !ok {
		return "", noTxError(ctx)
	}
	return o.PublishTx(ctx, tx, env)
}

// PublishTx is Publish with the transaction given explicitly.
func (o *Outbox) PublishTx(ctx context.Context, tx txctx.Tx, env Envelope) (string, error) {
	if tx == nil {
		return "", ErrNoTx
	}
	row, env, err := encode(o.interceptPublish(ctx, env), time.Now())
	if err != nil {
		return "", err
	}
	if err := o.write(ctx, tx, []driver.Row{row}, []Envelope{env}); err != nil {
		return "", err
	}
	return env.ID, nil
}

// PublishOnce is Publish for an event whose ID the caller chose as its
// idempotency key: if an event with that id exists already (committed
// before, or by a transaction that commits while this one waits for it),
// nothing is written, existed is true, and the transaction is as it was
// and still usable (so a retried request publishes its event once). The
// dedupe holds while the event's row is kept (Config.Retention, or
// sqlstore's DeleteDelivered or ArchiveDelivered: until it is
// delivered). An empty ID is a
// *ValidationError. The store must implement driver.OnceInserter
// (sqlstore does, but not on a partitioned MySQL table, whose primary key
// cannot refuse a reused id; outboxtest does).
func (o *Outbox) PublishOnce(ctx context.Context, env Envelope) (existed bool, err error) {
	tx, ok := txctx.From(ctx)
	if !ok {
		return false, noTxError(ctx)
	}
	return o.PublishOnceTx(ctx, tx, env)
}

// PublishOnceTx is PublishOnce with the transaction given explicitly.
func (o *Outbox) PublishOnceTx(ctx context.Context, tx txctx.Tx, env Envelope) (existed bool, err error) {
	if tx == nil {
		return false, ErrNoTx
	}
	env = o.interceptPublish(ctx, env)
	if env.ID == "" {
		return false, invalid("ID", "PublishOnce needs the event's ID: it is the idempotency key a second publish is refused by (Publish makes one)")
	}
	oi, ok := o.store.(driver.OnceInserter)
	if !ok {
		return false, fmt.Errorf("outbox: PublishOnce: the store (%T) does not implement driver.OnceInserter", o.store)
	}
	row, env, err := encode(env, time.Now())
	if err != nil {
		return false, err
	}
	err = o.writeVia(ctx, tx, []driver.Row{row}, []Envelope{env}, func(insert func() error) error {
		return oi.InsertOnce(ctx, tx, env.ID, insert)
	})
	if errors.Is(err, driver.ErrDuplicateID) {
		return true, nil
	}
	return false, err
}

// PublishAll writes envs through the transaction carried by ctx, in one
// statement per few hundred events when the store is a BatchInserter, and
// hands them to the dispatcher once that transaction commits. It returns
// their ids in order. Every envelope is validated first: if one is invalid,
// the error names its index and nothing is written.
func (o *Outbox) PublishAll(ctx context.Context, envs ...Envelope) ([]string, error) {
	tx, ok := txctx.From(ctx)
	if !ok {
		return nil, noTxError(ctx)
	}
	return o.PublishAllTx(ctx, tx, envs...)
}

// PublishAllTx is PublishAll with the transaction given explicitly.
func (o *Outbox) PublishAllTx(ctx context.Context, tx txctx.Tx, envs ...Envelope) ([]string, error) {
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
		row, env, err := encode(o.interceptPublish(ctx, env), now)
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
func (o *Outbox) write(ctx context.Context, tx txctx.Tx, rows []driver.Row, envs []Envelope) error {
	return o.writeVia(ctx, tx, rows, envs, func(insert func() error) error { return insert() })
}

// writeVia is write with the inserts run by via (once: in a savepoint
// that undoes them if the event's id exists).
func (o *Outbox) writeVia(ctx context.Context, tx txctx.Tx, rows []driver.Row, envs []Envelope, via func(insert func() error) error) error {
	tx, err := txctx.Begun(tx) // the store writes through the transaction itself
	if err != nil {
		return err
	}
	o.mu.RLock()
	closed := o.closed
	o.mu.RUnlock()
	hot := !o.cfg.DisableHotPath && !closed
	reg := o.reg.load()
	delayed, err := o.delayed(envs)
	if err != nil {
		return err
	}
	var mine []Envelope
	var mineRows, freeRows []driver.Row
	var ordered []int
	for i, env := range envs {
		if o.seq.ostore != nil && reg.ordered(env.Type) {
			if k := env.Key(); k != "" {
				rows[i].OrderingKey, envs[i].OrderingKey = k, k
				ordered = append(ordered, i)
				continue
			}
		}
		if hot && reg.has(env.Type) && env.delay == 0 {
			mine = append(mine, env)
			mineRows = append(mineRows, rows[i])
		} else {
			freeRows = append(freeRows, rows[i])
		}
	}
	written := time.Now() // before the INSERT: never later than the lease's start
	var mineOrdered []leasedOrdered
	var named []string
	err = via(func() error {
		if err := o.insert(ctx, tx, mineRows, o.cfg.InstanceID, o.cfg.Lease); err != nil {
			return err
		}
		if err := o.insert(ctx, tx, freeRows, "", 0); err != nil {
			return err
		}
		var err error
		if mineOrdered, named, err = o.insertOrdered(ctx, tx, reg, hot, rows, envs, ordered); err != nil {
			return err
		}
		return o.schedule(ctx, tx, envs, delayed)
	})
	if err != nil {
		return err
	}
	tx.AfterCommit(func() { o.committed(reg, envs, mine, mineOrdered, named, delayed, written) })
	return nil
}

// committed is what write leaves for after its transaction committed:
// the metrics (a rolled-back transaction makes none, nor, in prom, a
// label value), the hot path of the events leased here, the keys of the
// ordered ones written free for the sequencer, and the wake-ups of the
// delayed ones.
func (o *Outbox) committed(reg *registry, envs, mine []Envelope, mineOrdered []leasedOrdered, named []string, delayed []int, written time.Time) {
	for _, env := range envs {
		o.m.Published(env.Type)
	}
	for _, env := range mine {
		o.enqueueHot(env, written)
	}
	for _, p := range mineOrdered {
		o.enqueueOrdered(p, written)
	}
	for _, k := range named {
		o.disp.sig.name(k)
	}
	for _, i := range delayed {
		if reg.has(envs[i].Type) {
			o.disp.sig.scheduleRetryWake(envs[i].due) // the poll that takes it
		}
	}
}

// delayed returns the indexes of the envelopes of envs with a NotBefore
// ahead, or an error if there are some and the store cannot delay them.
func (o *Outbox) delayed(envs []Envelope) ([]int, error) {
	var out []int
	for i := range envs {
		if envs[i].delay > 0 {
			out = append(out, i)
		}
	}
	if _, ok := o.store.(driver.Scheduler); len(out) > 0 && !ok {
		return nil, fmt.Errorf("outbox: event %s has a NotBefore, and the store (%T) cannot delay events: it does not implement driver.Scheduler", envs[out[0]].ID, o.store)
	}
	return out, nil
}

// schedule makes the delayed events (indexes into envs), just inserted
// free, due at their NotBefore.
func (o *Outbox) schedule(ctx context.Context, tx txctx.Tx, envs []Envelope, delayed []int) error {
	for _, i := range delayed {
		if err := o.store.(driver.Scheduler).Schedule(ctx, tx, envs[i].ID, envs[i].delay); err != nil {
			return fmt.Errorf("outbox: delay event %s until %s: %w", envs[i].ID, envs[i].NotBefore.UTC().Format(time.RFC3339Nano), err)
		}
		// The database's delay started before Schedule returned: it is
		// due by then (on clocks in step), if not a little before.
		envs[i].due = time.Now().Add(envs[i].delay)
	}
	return nil
}

// leasedOrdered is an ordered event written leased to this instance.
type leasedOrdered struct {
	env  Envelope
	head bool // every earlier event of its key was delivered
}

// insertOrdered writes the events at ordered (indexes into rows and envs)
// numbered in their keys' sequences, key by key (a stable sort keeps
// each key's own order), so that transactions publishing the same keys
// lock them in the same order. It returns the events written leased to
// this instance, for the hot path: a key's head, or the event right
// after one of its key this instance holds (keyTable); and the keys of
// the others, to be named to the sequencer after commit: the event
// before may be finished by then, and nobody else would look for them
// until a poll.
func (o *Outbox) insertOrdered(ctx context.Context, tx txctx.Tx, reg *registry, hot bool, rows []driver.Row, envs []Envelope, ordered []int) ([]leasedOrdered, []string, error) {
	if len(ordered) == 0 {
		return nil, nil, nil
	}
	slices.SortStableFunc(ordered, func(a, b int) int { return strings.Compare(rows[a].OrderingKey, rows[b].OrderingKey) })
	f := reg.orderFilter()
	var mine []leasedOrdered
	var named []string
	for _, i := range ordered {
		owner := ""
		if hot && reg.has(envs[i].Type) && envs[i].delay == 0 {
			owner = o.cfg.InstanceID
			rows[i].KeyAfter = o.disp.keyAfter(rows[i].OrderingKey)
		}
		head, leased, err := o.seq.ostore.InsertOrdered(ctx, tx, &rows[i], owner, o.cfg.Lease, f)
		if err != nil {
			return nil, nil, fmt.Errorf("outbox: insert event %s (ordering key %q): %w", rows[i].ID, rows[i].OrderingKey, err)
		}
		envs[i].ordered, envs[i].seq = true, rows[i].KeySeq
		if leased && owner != "" {
			if rows[i].KeySeq > 0 {
				o.disp.leasedAtInsert(rows[i].OrderingKey, rows[i].KeySeq)
			}
			mine = append(mine, leasedOrdered{env: envs[i], head: head})
		} else if len(named) == 0 || named[len(named)-1] != rows[i].OrderingKey {
			named = append(named, rows[i].OrderingKey)
		}
	}
	return mine, named, nil
}

func (o *Outbox) insert(ctx context.Context, tx txctx.Tx, rows []driver.Row, owner string, lease time.Duration) error {
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

// enqueueHot hands a committed event to the dispatcher, unless the outbox
// is closed: then the row, leased to this instance, is given back so that
// another instance takes it at once instead of after the lease.
func (o *Outbox) enqueueHot(env Envelope, written time.Time) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.admit(env.ID) {
		o.disp.enqueueHot(env, written)
	}
}

// enqueueOrdered is enqueueHot for an ordered event leased here.
func (o *Outbox) enqueueOrdered(p leasedOrdered, written time.Time) {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.admit(p.env.ID) {
		o.disp.enqueueOrdered(p.env, p.head, written)
	}
}

// admit reports whether the dispatcher takes event id, committed and
// leased here; o.mu is read-locked by the caller. Once the outbox is
// closed it hands the event back instead; before Start it warns, once.
func (o *Outbox) admit(id string) bool {
	if o.closed {
		o.disp.handBackLate(id)
		return false
	}
	if !o.started && o.warnedUnstarted.CompareAndSwap(false, true) {
		o.log.Warn("events are published but the outbox is not started: they wait in memory until Start (call ob.Start(ctx) at startup)",
			slog.String("event_id", id))
	}
	return true
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

// PublishOnce is Publish for an event whose ID is its idempotency key
// (see Outbox.PublishOnce), with the outbox found the same way.
func PublishOnce(ctx context.Context, env Envelope) (existed bool, err error) {
	o := FromContext(ctx)
	if o == nil {
		return false, ErrNoOutbox
	}
	return o.PublishOnce(ctx, env)
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
