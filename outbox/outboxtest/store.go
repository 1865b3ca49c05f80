package outboxtest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

var (
	_ driver.Store           = (*Store)(nil)
	_ driver.DeliveryStore   = (*Store)(nil)
	_ driver.Inspector       = (*Store)(nil)
	_ driver.StatsReader     = (*Store)(nil)
	_ driver.DeadLetterStore = (*Store)(nil)
	_ driver.Cleaner         = (*Store)(nil)
	_ driver.BatchInserter   = (*Store)(nil)
	_ driver.OnceInserter    = (*Store)(nil)
	_ driver.Scheduler       = (*Store)(nil)
	_ driver.OrderedStore    = (*Store)(nil)
	_ txctx.Tx               = (*Tx)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithClock makes the store read the time from now instead of time.Now:
// it is the store's "database clock", which leases, due times, ages and
// retention are counted on. time.Now already follows the fake clock inside
// a testing/synctest bubble, so most tests need no option.
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = now }
}

// Store is an driver.Store that keeps its rows in memory, with the
// semantics of outbox/sqlstore: leases and owner checks, the claim order
// (due retries first, up to a quarter of a batch, then new events, oldest
// due first), split events with a delivery per subscription, dead letters,
// cleanup and stats. It runs the conformance suite of outbox/storetest, so
// a test that passes on it passes for the engine's reasons, not a mock's.
//
// It is safe for concurrent use. Rows are written only through its own
// transactions (Begin); what a transaction inserted is visible at its
// Commit and gone at its Rollback.
type Store struct {
	now func() time.Time

	mu     sync.Mutex
	seq    uint64
	events map[string]*memEvent
	deliv  map[string]map[string]*memDelivery // event id -> subscription -> delivery
	subs   map[string]*memSub
	// registry is the subscription registry's version
	// (driver.Registration.Version).
	registry int64
	changed  chan struct{} // closed and replaced on every change

	keySeq    map[string]int64       // ordering key -> last number given
	keyHolder map[string]*Tx         // ordering key -> the open transaction that publishes it
	staging   map[*memEvent]struct{} // ordered rows of open transactions
	effects   []TxEffect             // what Tx handlers committed (DeliverInTx)
}

type memEvent struct {
	row         driver.Row // Status, Attempts and CreatedAt kept here too
	seq         uint64
	availableAt time.Time
	owner       string
	lockedUntil time.Time // zero: no lease
	lastError   string
	doneAt      time.Time
}

type memDelivery struct {
	status      outbox.Status
	attempts    int
	availableAt time.Time
	createdAt   time.Time
	doneAt      time.Time
	owner       string
	lockedUntil time.Time
	lastError   string
	seq         uint64
	history     []outbox.Attempt // newest last
}

// record appends a counted failed attempt to d's history.
func (d *memDelivery) record(w driver.DeliveryWrite, now time.Time) {
	if w.Status != outbox.StatusRetry && w.Status != outbox.StatusDead {
		return
	}
	d.history = append(d.history, outbox.Attempt{N: w.Attempts, At: now, Error: w.Error})
}

type memSub struct {
	types  []string
	order  int8
	paused bool
	seen   time.Time
}

// NewStore returns an empty store.
func NewStore(opts ...Option) *Store {
	s := &Store{
		now:       time.Now,
		events:    map[string]*memEvent{},
		deliv:     map[string]map[string]*memDelivery{},
		subs:      map[string]*memSub{},
		changed:   make(chan struct{}),
		keySeq:    map[string]int64{},
		keyHolder: map[string]*Tx{},
		staging:   map[*memEvent]struct{}{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// touch signals a change to Drain. The caller holds s.mu.
func (s *Store) touch() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Store) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// free reports whether a lease has run out (or there is none) at now.
func free(lockedUntil, now time.Time) bool {
	return lockedUntil.IsZero() || !lockedUntil.After(now)
}

func undone(st outbox.Status) bool { return st == outbox.StatusNew || st == outbox.StatusRetry }

func cloneRow(r *driver.Row) driver.Row {
	c := *r
	c.Headers = slices.Clone(r.Headers)
	c.Payload = slices.Clone(r.Payload)
	if c.Payload == nil {
		c.Payload = []byte{}
	}
	return c
}

// --- transactions ---

// ErrNoSQL is returned by Tx.ExecContext: the in-memory store has no
// database to run a statement on.
var ErrNoSQL = errors.New("outboxtest: the in-memory store runs no SQL: keep the business state of the test in memory too, or test against outbox/sqlstore")

// Tx is a transaction on a Store: the rows inserted through it become
// visible at Commit and vanish at Rollback, and its after-commit and
// after-rollback hooks run then (savepoints are not supported). It
// implements txctx.Tx; ExecContext returns ErrNoSQL. It is safe
// for concurrent use.
type Tx struct {
	txctx.Hooks
	st  *Store
	ctx context.Context

	mu   sync.Mutex
	rows []*memEvent
	done bool

	// Guarded by the Store's mu: the ordering keys it holds, with their
	// numbers before it took them; the transaction it waits for; closed
	// when it ends.
	keyBase    map[string]int64
	waitingFor *Tx
	ended      chan struct{}
}

// endedChan returns the channel closed when tx ends. The caller holds the
// Store's mu.
func (tx *Tx) endedChan() chan struct{} {
	if tx.ended == nil {
		tx.ended = make(chan struct{})
	}
	return tx.ended
}

// Begin starts a transaction. ctx carries the logger for hooks that
// panic (txctx.WithLogger).
func (s *Store) Begin(ctx context.Context) *Tx { return &Tx{st: s, ctx: ctx} }

// ExecContext returns ErrNoSQL: there is no SQL to run.
func (tx *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return nil, ErrNoSQL
}

// Commit makes the transaction's rows visible and runs the after-commit
// hooks. It fails with sql.ErrTxDone after Commit or Rollback, and fails
// (running the after-rollback hooks, writing nothing) if an event id is
// already taken, like a primary key.
func (tx *Tx) Commit() error { return tx.Hooks.End(tx.ctx, tx.commit, true) }

func (tx *Tx) commit() error {
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return sql.ErrTxDone
	}
	tx.done = true
	rows := tx.rows
	tx.rows = nil
	tx.mu.Unlock()

	s := tx.st
	s.mu.Lock()
	for _, e := range rows {
		delete(s.staging, e)
	}
	for _, e := range rows {
		if _, dup := s.events[e.row.ID]; dup {
			s.unlockKeys(tx, true)
			s.mu.Unlock()
			return fmt.Errorf("outboxtest: commit: event id %q exists already", e.row.ID)
		}
	}
	s.unlockKeys(tx, false)
	for _, e := range rows {
		s.seq++
		e.seq = s.seq
		s.events[e.row.ID] = e
	}
	if len(rows) > 0 {
		s.touch()
	}
	s.mu.Unlock()
	return nil
}

// Rollback drops the transaction's rows and runs the after-rollback
// hooks. It returns sql.ErrTxDone after Commit or Rollback, so it is safe
// to defer.
func (tx *Tx) Rollback() error { return tx.Hooks.End(tx.ctx, tx.rollback, false) }

func (tx *Tx) rollback() error {
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return sql.ErrTxDone
	}
	rows := tx.rows
	tx.done, tx.rows = true, nil
	tx.mu.Unlock()
	tx.st.unstage(rows, tx)
	return nil
}

func (s *Store) txOf(exec driver.Execer) (*Tx, error) {
	tx, ok := exec.(*Tx)
	if !ok || tx == nil {
		return nil, fmt.Errorf("outboxtest: insert through %T: the in-memory store writes only through its own transactions; begin one with Store.Begin and publish with PublishTx (or txctx.With)", exec)
	}
	if tx.st != s {
		return nil, errors.New("outboxtest: insert through a transaction of another Store")
	}
	return tx, nil
}

// Insert implements driver.Store: the row is staged in exec, which must be
// a *Tx of this store, until it commits.
func (s *Store) Insert(ctx context.Context, exec driver.Execer, row *driver.Row, owner string, lease time.Duration) error {
	return s.InsertBatch(ctx, exec, []driver.Row{*row}, owner, lease)
}

// InsertBatch implements driver.BatchInserter: all rows or none.
func (s *Store) InsertBatch(ctx context.Context, exec driver.Execer, rows []driver.Row, owner string, lease time.Duration) error {
	tx, err := s.txOf(exec)
	if err != nil {
		return err
	}
	now := s.now()
	staged := make([]*memEvent, 0, len(rows))
	s.mu.Lock()
	for i := range rows {
		if _, dup := s.events[rows[i].ID]; dup {
			s.mu.Unlock()
			return fmt.Errorf("outboxtest: insert: event id %q exists already", rows[i].ID)
		}
	}
	s.mu.Unlock()
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return sql.ErrTxDone
	}
	seen := map[string]bool{}
	for _, e := range tx.rows {
		seen[e.row.ID] = true
	}
	for i := range rows {
		if seen[rows[i].ID] {
			return fmt.Errorf("outboxtest: insert: event id %q exists already", rows[i].ID)
		}
		seen[rows[i].ID] = true
		r := cloneRow(&rows[i])
		r.Status, r.Attempts, r.CreatedAt, r.PrevOwner, r.ReadError = outbox.StatusNew, 0, now, "", nil
		r.KeySeq = 0 // numbered only by InsertOrdered
		e := &memEvent{row: r, availableAt: now}
		if owner != "" {
			e.owner, e.lockedUntil = owner, now.Add(lease)
		}
		staged = append(staged, e)
	}
	tx.rows = append(tx.rows, staged...)
	return nil
}

// InsertOnce implements driver.OnceInserter: an id committed or staged in
// exec already is driver.ErrDuplicateID, and nothing is staged; what
// insert staged before it failed is taken back. (Two transactions staging
// one id at once are not held against each other.)
func (s *Store) InsertOnce(ctx context.Context, exec driver.Execer, id string, insert func() error) error {
	tx, err := s.txOf(exec)
	if err != nil {
		return err
	}
	s.mu.Lock()
	_, dup := s.events[id]
	s.mu.Unlock()
	tx.mu.Lock()
	staged := len(tx.rows)
	for _, e := range tx.rows {
		dup = dup || e.row.ID == id
	}
	tx.mu.Unlock()
	if dup {
		return driver.ErrDuplicateID
	}
	if err := insert(); err != nil {
		tx.mu.Lock()
		if len(tx.rows) > staged {
			tx.rows = tx.rows[:staged]
		}
		tx.mu.Unlock()
		return err
	}
	return nil
}

// Schedule implements driver.Scheduler: the event, staged free in exec,
// is due delay after now.
func (s *Store) Schedule(ctx context.Context, exec driver.Execer, id string, delay time.Duration) error {
	tx, err := s.txOf(exec)
	if err != nil {
		return err
	}
	now := s.now()
	tx.mu.Lock()
	defer tx.mu.Unlock()
	for _, e := range tx.rows {
		if e.row.ID == id && e.owner == "" {
			e.availableAt = now.Add(delay)
			e.row.CreatedAt = e.availableAt
			return nil
		}
	}
	return fmt.Errorf("outboxtest: schedule event %s: not staged free in this transaction", id)
}

// Scheduled implements driver.Scheduler.
func (s *Store) Scheduled(ctx context.Context, dueAfter time.Time, idAfter string, limit int) ([]driver.ScheduledEvent, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []driver.ScheduledEvent
	for _, e := range s.events {
		if e.row.Status != outbox.StatusNew || !e.availableAt.After(now) || !free(e.lockedUntil, now) {
			continue
		}
		if idAfter != "" && (e.availableAt.Before(dueAfter) || (e.availableAt.Equal(dueAfter) && e.row.ID <= idAfter)) {
			continue
		}
		out = append(out, driver.ScheduledEvent{ID: e.row.ID, Type: e.row.Type, AggregateType: e.row.AggregateType,
			AggregateID: e.row.AggregateID, OrderingKey: e.row.OrderingKey, Due: e.availableAt})
	}
	slices.SortFunc(out, func(a, b driver.ScheduledEvent) int {
		return cmp.Or(a.Due.Compare(b.Due), strings.Compare(a.ID, b.ID))
	})
	return out[:min(len(out), max(0, limit))], nil
}

// NextDue implements driver.Scheduler.
func (s *Store) NextDue(ctx context.Context) (time.Duration, bool, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	for _, e := range s.events {
		if e.row.Status != outbox.StatusNew || !e.availableAt.After(now) || !free(e.lockedUntil, now) {
			continue
		}
		if next.IsZero() || e.availableAt.Before(next) {
			next = e.availableAt
		}
	}
	if next.IsZero() {
		return 0, false, nil
	}
	return next.Sub(now), true, nil
}

// Cancel implements driver.Scheduler.
func (s *Store) Cancel(ctx context.Context, id string) (bool, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.events[id]
	switch {
	case e == nil:
		return false, driver.ErrNotFound
	case e.row.KeySeq != 0:
		return false, driver.ErrOrderedNotCancellable
	case e.row.Status != outbox.StatusNew || !e.availableAt.After(now) || !free(e.lockedUntil, now):
		return false, nil
	}
	e.row.Status, e.doneAt, e.availableAt, e.lastError = outbox.StatusDone, now, now, "cancelled before it was due"
	s.touch()
	return true, nil
}

// --- claims and outcomes of whole events ---

// Claim implements driver.Store.
func (s *Store) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if req.Limit <= 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var retries, news []*memEvent
	newBefore := now.Add(-max(0, req.SkipRecent))
	for _, e := range s.events {
		if !free(e.lockedUntil, now) || e.row.KeySeq != 0 || !req.TypeAllowed(e.row.Type) {
			continue // ordered events are claimed by ClaimHeads
		}
		switch {
		case e.row.Status == outbox.StatusRetry && !e.availableAt.After(now):
			retries = append(retries, e)
		case e.row.Status == outbox.StatusNew && !e.availableAt.After(newBefore):
			news = append(news, e)
		}
	}
	byDue := func(a, b *memEvent) int {
		return cmp.Or(a.availableAt.Compare(b.availableAt), cmp.Compare(a.seq, b.seq))
	}
	slices.SortFunc(retries, byDue)
	slices.SortFunc(news, byDue)
	picked := retries[:min(len(retries), max(1, req.Limit/4))]
	picked = append(picked, news[:min(len(news), req.Limit-len(picked))]...)
	out := make([]driver.Row, 0, len(picked))
	for _, e := range picked {
		r := cloneRow(&e.row)
		if e.owner != req.Owner {
			r.PrevOwner = e.owner
		}
		e.owner, e.lockedUntil = req.Owner, now.Add(req.Lease)
		out = append(out, r)
	}
	if len(out) > 0 {
		s.touch()
	}
	return out, nil
}

// held returns the event id if owner holds it and it is NEW or RETRY.
func (s *Store) held(owner, id string) *memEvent {
	e := s.events[id]
	if e == nil || e.owner != owner || !undone(e.row.Status) {
		return nil
	}
	return e
}

// MarkDone implements driver.Store.
func (s *Store) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fence(registry); err != nil {
		return 0, fmt.Errorf("outboxtest: mark done: %w", err)
	}
	n := 0
	for _, id := range ids {
		if e := s.held(owner, id); e != nil {
			e.row.Status, e.doneAt, e.owner, e.lockedUntil = outbox.StatusDone, now, "", time.Time{}
			n++
		}
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}

// MarkRetry implements driver.Store.
func (s *Store) MarkRetry(ctx context.Context, owner, id string, delay time.Duration, errText string) (bool, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(owner, id)
	if e == nil {
		return false, nil
	}
	e.row.Status, e.row.Attempts, e.availableAt, e.lastError = outbox.StatusRetry, e.row.Attempts+1, now.Add(delay), errText
	e.owner, e.lockedUntil = "", time.Time{}
	s.touch()
	return true, nil
}

// MarkDead implements driver.Store.
func (s *Store) MarkDead(ctx context.Context, owner, id string, errText string) (bool, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(owner, id)
	if e == nil {
		return false, nil
	}
	e.row.Status, e.row.Attempts, e.doneAt, e.lastError = outbox.StatusDead, e.row.Attempts+1, now, errText
	e.owner, e.lockedUntil = "", time.Time{}
	s.touch()
	return true, nil
}

// ExtendLeases implements driver.Store.
func (s *Store) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if e := s.held(owner, id); e != nil {
			e.lockedUntil = now.Add(lease)
			n++
		}
	}
	return n, nil
}

// Release implements driver.Store.
func (s *Store) Release(ctx context.Context, owner string, ids []string, delay time.Duration) error {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if e := s.held(owner, id); e != nil {
			e.owner, e.lockedUntil = "", time.Time{}
			if delay > 0 {
				e.availableAt = now.Add(delay)
			}
			n++
		}
	}
	if n > 0 {
		s.touch()
	}
	return nil
}

// --- subscriptions and deliveries ---

// fence returns driver.ErrRegistryChanged unless registry is the
// registry's version (s.mu held).
func (s *Store) fence(registry int64) error {
	if registry != s.registry {
		return driver.ErrRegistryChanged
	}
	return nil
}

// SyncSubscriptions implements driver.DeliveryStore.
func (s *Store) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sub := range subs {
		m := s.subs[sub.Name]
		if m == nil || driver.Widens(m.types, sub.Types) {
			s.registry++
		}
		if m == nil {
			m = &memSub{}
			s.subs[sub.Name] = m
		}
		m.types, m.order, m.seen = slices.Clone(sub.Types), sub.Order, now
		if len(m.types) == 0 {
			m.types = nil
		}
	}
	out := make([]driver.SubscriptionState, 0, len(s.subs))
	for name, m := range s.subs {
		out = append(out, driver.SubscriptionState{
			SubscriptionInfo: driver.SubscriptionInfo{Name: name, Types: slices.Clone(m.types), Order: m.order},
			Paused:           m.paused,
			Idle:             max(0, now.Sub(m.seen)),
		})
	}
	slices.SortFunc(out, func(a, b driver.SubscriptionState) int { return cmp.Compare(a.Name, b.Name) })
	return driver.Registration{Version: s.registry, Subscriptions: out}, nil
}

// SetPaused implements driver.DeliveryStore.
func (s *Store) SetPaused(ctx context.Context, name string, paused bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.subs[name]
	if m == nil {
		return false, nil
	}
	m.paused = paused
	s.touch()
	return true, nil
}

// Split implements driver.DeliveryStore.
func (s *Store) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	if len(splits) == 0 {
		return nil, nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fence(registry); err != nil {
		return nil, fmt.Errorf("outboxtest: split %s: %w", splits[0].EventID, err)
	}
	for _, sp := range splits {
		if s.held(owner, sp.EventID) == nil {
			continue
		}
		for _, w := range sp.Writes {
			if s.deliv[sp.EventID][w.Subscription] != nil {
				return nil, fmt.Errorf("outboxtest: split %s: a delivery to %q exists already", sp.EventID, w.Subscription)
			}
		}
	}
	held := make([]bool, len(splits))
	for i, sp := range splits {
		e := s.held(owner, sp.EventID)
		if e == nil {
			continue
		}
		held[i] = true
		ds := s.deliv[sp.EventID]
		if ds == nil {
			ds = map[string]*memDelivery{}
			s.deliv[sp.EventID] = ds
		}
		e.row.Status, e.doneAt, e.owner, e.lockedUntil = outbox.StatusSplit, time.Time{}, "", time.Time{}
		for _, w := range sp.Writes {
			s.seq++
			d := &memDelivery{status: w.Status, attempts: w.Attempts, availableAt: now.Add(max(0, w.Delay)), createdAt: now, lastError: w.Error, seq: s.seq}
			if w.Status == outbox.StatusDead {
				d.doneAt = now
			}
			d.record(w, now)
			ds[w.Subscription] = d
		}
	}
	s.touch()
	return held, nil
}

type pickedDelivery struct {
	key driver.DeliveryID
	d   *memDelivery
}

// ClaimDeliveries implements driver.DeliveryStore. req.SkipRecent does not
// apply: deliveries are written after a first attempt.
func (s *Store) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	if req.Limit <= 0 || len(subs) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var retries, news []pickedDelivery
	var byKey map[string][]*memEvent // for ordered subscriptions' heads
	for id, ds := range s.deliv {
		for _, name := range subs {
			d := ds[name]
			if d == nil || !free(d.lockedUntil, now) || d.availableAt.After(now) {
				continue
			}
			if e := s.events[id]; e != nil && e.row.KeySeq != 0 && f.Ordered(name) {
				if byKey == nil {
					byKey = s.keyEvents(nil)
				}
				if es := byKey[e.row.OrderingKey]; s.owes(es, e.row.KeySeq, name, f) || s.inFlight(es, e, name, now) {
					continue // not its turn: an earlier event of its key is pending for it, or another is in flight to it
				}
			}
			p := pickedDelivery{driver.DeliveryID{EventID: id, Subscription: name}, d}
			switch d.status {
			case outbox.StatusRetry:
				retries = append(retries, p)
			case outbox.StatusNew:
				news = append(news, p)
			}
		}
	}
	byDue := func(a, b pickedDelivery) int {
		return cmp.Or(a.d.availableAt.Compare(b.d.availableAt), cmp.Compare(a.d.seq, b.d.seq))
	}
	slices.SortFunc(retries, byDue)
	slices.SortFunc(news, byDue)
	picked := retries[:min(len(retries), max(1, req.Limit/4))]
	picked = append(picked, news[:min(len(news), req.Limit-len(picked))]...)
	out := make([]driver.Delivery, 0, len(picked))
	for _, p := range picked {
		prev := p.d.owner
		p.d.owner, p.d.lockedUntil = req.Owner, now.Add(req.Lease)
		e := s.events[p.key.EventID]
		if e == nil {
			continue // the event was deleted: nothing to deliver
		}
		d := driver.Delivery{Row: cloneRow(&e.row), Subscription: p.key.Subscription}
		d.Status, d.Attempts, d.PrevOwner = p.d.status, p.d.attempts, ""
		if prev != "" && prev != req.Owner {
			d.PrevOwner = prev
		}
		out = append(out, d)
	}
	out = s.deliveryRuns(out, req, f, byKey, now)
	if len(picked) > 0 {
		s.touch()
	}
	return out, nil
}

// deliveryRuns leases, behind each delivery of out to an ordered
// subscription of f, the deliveries to that subscription of the events
// that follow its event in its key without a gap, each split with that
// delivery NEW or RETRY, due and free (req.Run shared over those heads),
// and appends them to out. The caller holds s.mu.
func (s *Store) deliveryRuns(out []driver.Delivery, req driver.ClaimRequest, f driver.OrderFilter, byKey map[string][]*memEvent, now time.Time) []driver.Delivery {
	var heads []driver.Delivery
	for _, d := range out {
		if d.KeySeq > 0 && f.Ordered(d.Subscription) {
			heads = append(heads, d)
		}
	}
	if req.Run <= 0 || len(heads) == 0 {
		return out
	}
	if byKey == nil {
		byKey = s.keyEvents(nil)
	}
	per := req.Run / len(heads)
	for _, h := range heads {
		seq, n := h.KeySeq, 0
		for _, e := range byKey[h.OrderingKey] {
			if e.row.KeySeq <= h.KeySeq {
				continue
			}
			d := s.deliv[e.row.ID][h.Subscription]
			if n == per || e.row.KeySeq != seq+1 || e.row.Status != outbox.StatusSplit || d == nil || !undone(d.status) || !free(d.lockedUntil, now) || d.availableAt.After(now) {
				break
			}
			prev := d.owner
			d.owner, d.lockedUntil = req.Owner, now.Add(req.Lease)
			r := driver.Delivery{Row: cloneRow(&e.row), Subscription: h.Subscription}
			r.Status, r.Attempts = d.status, d.attempts
			if prev != "" && prev != req.Owner {
				r.PrevOwner = prev
			}
			out = append(out, r)
			seq, n = e.row.KeySeq, n+1
		}
	}
	return out
}

func (s *Store) heldDelivery(owner string, k driver.DeliveryID) *memDelivery {
	d := s.deliv[k.EventID][k.Subscription]
	if d == nil || d.owner != owner || !undone(d.status) {
		return nil
	}
	return d
}

// CompleteDeliveries implements driver.DeliveryStore.
func (s *Store) CompleteDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if d := s.heldDelivery(owner, k); d != nil {
			d.status, d.doneAt, d.owner, d.lockedUntil = outbox.StatusDone, now, "", time.Time{}
			n++
		}
	}
	for _, k := range keys {
		s.completeSplit(k.EventID, now)
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}

// completeSplit makes a split event DONE once none of its deliveries is
// left undone. The caller holds s.mu.
func (s *Store) completeSplit(id string, now time.Time) {
	e := s.events[id]
	if e == nil || e.row.Status != outbox.StatusSplit {
		return
	}
	for _, d := range s.deliv[id] {
		if d.status != outbox.StatusDone {
			return
		}
	}
	e.row.Status, e.doneAt = outbox.StatusDone, now
}

// FailDelivery implements driver.DeliveryStore.
func (s *Store) FailDelivery(ctx context.Context, owner string, key driver.DeliveryID, w driver.DeliveryWrite) (bool, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.heldDelivery(owner, key)
	if d == nil {
		return false, nil
	}
	d.status, d.attempts, d.availableAt = w.Status, w.Attempts, now.Add(max(0, w.Delay))
	d.doneAt = time.Time{}
	if w.Status == outbox.StatusDead {
		d.doneAt = now
	}
	if w.Error != "" {
		d.lastError = w.Error
	}
	d.record(w, now)
	d.owner, d.lockedUntil = "", time.Time{}
	s.touch()
	return true, nil
}

// ExtendDeliveryLeases implements driver.DeliveryStore.
func (s *Store) ExtendDeliveryLeases(ctx context.Context, owner string, keys []driver.DeliveryID, lease time.Duration) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if d := s.heldDelivery(owner, k); d != nil {
			d.lockedUntil = now.Add(lease)
			n++
		}
	}
	return n, nil
}

// ReleaseDeliveries implements driver.DeliveryStore.
func (s *Store) ReleaseDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID, delay time.Duration) error {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if d := s.heldDelivery(owner, k); d != nil {
			d.owner, d.lockedUntil = "", time.Time{}
			if delay > 0 {
				d.availableAt = now.Add(delay)
			}
			n++
		}
	}
	if n > 0 {
		s.touch()
	}
	return nil
}

// --- tools ---

// Inspect implements driver.Inspector.
func (s *Store) Inspect(ctx context.Context, id string) (outbox.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.events[id]
	if e == nil {
		return outbox.Record{}, outbox.ErrNotFound
	}
	rec := outbox.Record{Row: cloneRow(&e.row), Owner: e.owner, LastError: e.lastError}
	for _, name := range slices.Sorted(mapKeys(s.deliv[id])) {
		d := s.deliv[id][name]
		var hist []outbox.Attempt
		for i := len(d.history) - 1; i >= 0 && len(hist) < driver.MaxHistory; i-- {
			hist = append(hist, d.history[i])
		}
		rec.Deliveries = append(rec.Deliveries, outbox.DeliveryRecord{
			Subscription: name, Status: d.status, Attempts: d.attempts, Owner: d.owner, LastError: d.lastError, History: hist,
		})
	}
	return rec, nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Stats implements driver.StatsReader.
func (s *Store) Stats(ctx context.Context) (outbox.Stats, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var st outbox.Stats
	var oldest time.Time
	for _, e := range s.events {
		switch e.row.Status {
		case outbox.StatusNew:
			st.New++
		case outbox.StatusRetry:
			st.Retry++
		case outbox.StatusDone:
			st.Done++
		case outbox.StatusDead:
			st.Dead++
		case outbox.StatusSplit:
			st.Split++
			for _, d := range s.deliv[e.row.ID] {
				if d.status == outbox.StatusDead {
					st.DeadDeliveries++
				}
			}
		default:
			st.Unknown++
		}
		if undone(e.row.Status) && (oldest.IsZero() || e.row.CreatedAt.Before(oldest)) {
			oldest = e.row.CreatedAt
		}
	}
	if !oldest.IsZero() {
		st.OldestPending = max(0, now.Sub(oldest))
	}
	return st, nil
}

// ListDead implements driver.DeadLetterStore.
func (s *Store) ListDead(ctx context.Context, after string, limit int) ([]outbox.DeadLetter, error) {
	if limit <= 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []outbox.DeadLetter
	letter := func(e *memEvent, sub string, attempts int, lastError string) outbox.DeadLetter {
		return outbox.DeadLetter{ID: e.row.ID, Subscription: sub, Type: e.row.Type, AggregateType: e.row.AggregateType,
			AggregateID: e.row.AggregateID, TenantID: e.row.TenantID, Attempts: attempts, LastError: lastError, CreatedAt: e.row.CreatedAt}
	}
	for id, e := range s.events {
		if id <= after {
			continue
		}
		if e.row.Status == outbox.StatusDead {
			all = append(all, letter(e, "", e.row.Attempts, e.lastError))
		}
		for name, d := range s.deliv[id] {
			if d.status == outbox.StatusDead {
				all = append(all, letter(e, name, d.attempts, d.lastError))
			}
		}
	}
	slices.SortFunc(all, func(a, b outbox.DeadLetter) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Subscription, b.Subscription))
	})
	cut := min(limit, len(all))
	for cut < len(all) && all[cut].ID == all[cut-1].ID {
		cut++ // the dead deliveries of one event stay on one page
	}
	return all[:cut], nil
}

// Replay implements driver.DeadLetterStore.
func (s *Store) Replay(ctx context.Context, ids []string) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if e := s.events[id]; e != nil && e.row.Status == outbox.StatusDead {
			e.row.Status, e.row.Attempts, e.availableAt, e.doneAt = outbox.StatusNew, 0, now, time.Time{}
			e.owner, e.lockedUntil = "", time.Time{}
			n++
		}
		for _, d := range s.deliv[id] {
			if d.status == outbox.StatusDead {
				d.status, d.attempts, d.availableAt, d.doneAt = outbox.StatusNew, 0, now, time.Time{}
				d.owner, d.lockedUntil = "", time.Time{}
				n++
			}
		}
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}

// Cleanup implements driver.Cleaner, on the store's clock: DONE events
// (and with includeDead, DEAD events and split events none of whose
// deliveries is pending or ended after the cut-off) last due before it.
func (s *Store) Cleanup(ctx context.Context, olderThan time.Duration, limit int, includeDead bool) (int64, error) {
	cutoff := s.now().Add(-olderThan)
	s.mu.Lock()
	defer s.mu.Unlock()
	var picked []*memEvent
	for id, e := range s.events {
		if !e.availableAt.Before(cutoff) {
			continue
		}
		switch e.row.Status {
		case outbox.StatusDone:
		case outbox.StatusDead:
			if !includeDead {
				continue
			}
		case outbox.StatusSplit:
			if !includeDead {
				continue
			}
			finished := true
			for _, d := range s.deliv[id] {
				if undone(d.status) || (!d.doneAt.IsZero() && !d.doneAt.Before(cutoff)) {
					finished = false
				}
			}
			if !finished {
				continue
			}
		default:
			continue
		}
		picked = append(picked, e)
	}
	slices.SortFunc(picked, func(a, b *memEvent) int {
		return cmp.Or(a.availableAt.Compare(b.availableAt), cmp.Compare(a.seq, b.seq))
	})
	picked = picked[:min(len(picked), max(0, limit))]
	for _, e := range picked {
		delete(s.events, e.row.ID)
		delete(s.deliv, e.row.ID)
	}
	if len(picked) > 0 {
		s.touch()
	}
	return int64(len(picked)), nil
}

// DueNow implements driver.DeliveryStore.
func (s *Store) DueNow(ctx context.Context, sub string) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ds := range s.deliv {
		if d := ds[sub]; d != nil && d.status == outbox.StatusNew && d.owner == "" && d.availableAt.After(now) {
			d.availableAt = now
			n++
		}
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}
