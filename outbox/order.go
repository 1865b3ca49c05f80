package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Order says whether a subscription receives the events of one ordering
// key in order (Subscription.Order).
//
// The guarantee: an ordered subscription receives the events of one key
// one at a time, in the order of their keys' sequence, on whatever
// instance delivers them. Each event gets its number in the sequence when
// Publish writes it, and writing it locks the key until the transaction
// ends; so the sequence is the order in which the publishing transactions
// committed, whatever they lock themselves. The next event of a key
// reaches the subscription only once the previous one was delivered to it
// (or, with OrderedSkipDead, went dead). An event published while the one
// before it is in this instance's hands waits in memory behind it and goes
// out once it was delivered to every subscription here, before its DONE
// is written. Head-of-line is per key and subscription: a failing event
// holds back the later events of its key for the subscription it failed
// for, and nothing else. They wait in the table for that subscription
// while the other keys, and the other subscriptions of this key, flow.
//
// What is not ordered: events of different keys (delivered concurrently,
// in any order); events with no key (no OrderingKey and no AggregateID);
// events published by an instance that did not know of an ordered
// subscription of their type (it learns them at Start and every
// PollInterval, from the database: an instance that publishes without
// calling Start orders nothing); and, after a crash or a lease that
// ran out, a redelivery (at least once: an event may come again after
// later ones were delivered, with its original id; a crash may repeat
// several events of a key, in order). Replaying dead events
// delivers them in their original order, but after the events that went
// on without them under OrderedSkipDead (never while one of those is in
// the handler). Changing a subscription from OrderedSkipDead to Ordered
// makes its old dead events block their keys.
type Order int8

const (
	// Unordered subscriptions receive events in any order, many of one
	// key at once. The default.
	Unordered Order = iota
	// Ordered delivers the events of one key in order; a dead event blocks
	// its key for the subscription (its later events wait for it) until an
	// operator replays it (Outbox.Replay) or skips it (Outbox.SkipDead).
	// BlockedKeys lists blocked keys.
	Ordered
	// OrderedSkipDead delivers the events of one key in order; a dead
	// event is passed over and the key goes on.
	OrderedSkipDead
)

func (o Order) String() string {
	switch o {
	case Unordered:
		return "unordered"
	case Ordered:
		return "ordered"
	case OrderedSkipDead:
		return "ordered-skip-dead"
	}
	return "order(?)"
}

// MaxOrderingKeyLen is the longest ordering key accepted, in bytes.
const MaxOrderingKeyLen = 255

// Key returns the event's ordering key: OrderingKey if set, else
// AggregateType and AggregateID joined by ":" when AggregateID is set,
// else "" (the event is not ordered).
func (e *Envelope) Key() string {
	if e.OrderingKey != "" {
		return e.OrderingKey
	}
	if e.AggregateID == "" {
		return ""
	}
	return string(e.AggregateType) + ":" + e.AggregateID
}

// indexOrder records the ordered subscriptions of this instance and of
// the others (as the database last said): events of their types are
// numbered in their keys' sequences wherever they are published, and the
// filter decides what holds a key.
func (r *registry) indexOrder() {
	r.filter, r.orderedAll, r.orderedTypes = driver.OrderFilter{}, false, map[EventType]bool{}
	add := func(name string, o Order, types []EventType) {
		switch o {
		case Ordered:
			r.filter.Block = append(r.filter.Block, name)
		case OrderedSkipDead:
			r.filter.Skip = append(r.filter.Skip, name)
		default:
			return
		}
		if len(types) == 0 {
			r.orderedAll = true
		}
		for _, t := range types {
			r.orderedTypes[t] = true
		}
	}
	for _, s := range r.local {
		add(s.Name, s.Order, s.Types)
	}
	for name, o := range r.remoteOrder {
		add(name, o, r.remote[name])
	}
	slices.Sort(r.filter.Block)
	slices.Sort(r.filter.Skip)
	// No unordered subscription anywhere (remote ones are in remoteOrder
	// only when ordered).
	r.filter.Every = len(r.filter.Block)+len(r.filter.Skip) == len(r.local)+len(r.remote)
}

// orderFilter returns the names of the ordered subscriptions, here and on
// other instances, as the store wants them.
func (r *registry) orderFilter() driver.OrderFilter { return r.filter }

// ordered reports whether an ordered subscription, here or on another
// instance, takes type t.
func (r *registry) ordered(t EventType) bool { return r.orderedAll || r.orderedTypes[t] }

// sequencer claims the heads of ordering keys: of the keys whose previous
// head was just finished here (or that were published here behind an
// earlier event), as soon as they are named, and of every key with events
// due, at each poll. What it claims goes to the cold queue. Every instance
// with a subscription takes part, not only those with an ordered one:
// numbered events must still go out when the ordered subscription is
// gone, or runs elsewhere.
type sequencer struct {
	*deps
	ostore driver.OrderedStore // nil: the store orders nothing
	disp   *dispatcher         // what it claims goes there
	comp   *completer          // told when keys are shared (lingerNow)
	sig    *signals
	reg    *registrar

	keys chan named // keys to look at; when full, the poll finds them

	mu    sync.Mutex // guards after and full (the poller and Outbox.Poll sweep)
	after string     // the sweep's cursor over keys
	full  bool       // the last sweep stopped at the bound of keys (keysPerWorker): sweep again when one ends
	runner
}

// keysPerWorker bounds the keys whose heads an instance claims from the
// table to keysPerWorker × Config.Workers at a time (keys whose events it
// has in hand, published elsewhere; those published here do not count).
// A key's events go out one at a time, so more keys than workers only
// wait in the cold queue here, where no other instance can deliver them:
// without the bound, the first instance to sweep a backlog of 100 keys
// took every one of them, and three instances drained it at the speed of
// one. The sequencer sweeps again as each key ends (refill).
const keysPerWorker = 2

// maxNamedKeys bounds the keys waiting for the sequencer.
const maxNamedKeys = 4096

// named is a key to look at, and the event of it just finished, if any.
type named struct {
	key string
	ev  driver.KeyDone // EventID "": none
	// held: the key's next event is in this instance's hands (handed on
	// in memory): ev is to be recorded, the key not claimed.
	held bool
	// quiet: ev failed here for every subscription that takes it, each
	// ordered, and none is due again before quiet: nothing of the key can
	// be claimed until then (see run).
	quiet time.Time
	// past: a DONE of the key numbered past was written; if this
	// instance holds the key past it (keyTable.holdsAfter), whoever
	// finishes that one names the key, and a claim now is wasted.
	past int64
}

func newSequencer(d *deps) *sequencer {
	s := &sequencer{deps: d, keys: make(chan named, maxNamedKeys)}
	s.ostore, _ = d.store.(driver.OrderedStore)
	return s
}

// maxQuietKeys bounds the keys the sequencer holds back (run): past it,
// it forgets those, and claims on every naming.
const maxQuietKeys = 1 << 14

// run records what finished and claims the heads of named keys, a batch
// at a time, until ctx ends.
//
// A key whose head failed here and waits for its retry (named.quiet) is
// quiet until then: its publishers' namings (each event written behind
// it names it at commit) are held back until the retry is due, instead
// of each costing a claim that reads the key's backlog and takes nothing,
// back to back for as long as a destination is down. The poll claims the
// head when it falls due, as it does every due head; an event of the key
// finished here meanwhile (a replay, another instance's) ends the quiet.
func (s *sequencer) run(ctx context.Context) {
	q := newNamings()
	defer q.wake.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-s.keys:
			s.take(q, n)
		case <-q.wake.C:
			if q.fired(time.Now()); len(q.batch) == 0 {
				continue
			}
		case <-s.disp.keys.space:
			s.refill(ctx)
			continue
		}
	more:
		for len(q.batch) < 100 {
			select {
			case n := <-s.keys:
				s.take(q, n)
			default:
				break more
			}
		}
		keys := make([]string, 0, len(q.batch))
		for k := range q.batch {
			keys = append(keys, k)
		}
		clear(q.batch)
		slices.Sort(keys)
		s.keysDone(ctx, q.done)
		q.done = q.done[:0]
		s.claim(ctx, keys, len(keys))
	}
}

// refill sweeps for more keys, as much as the cold queue has room for,
// if the last sweep stopped at the bound of keys (keysPerWorker): one of
// them just ended.
func (s *sequencer) refill(ctx context.Context) {
	s.mu.Lock()
	full := s.full
	s.mu.Unlock()
	if !full {
		return
	}
	room := min(s.cfg.PollBatchSize, cap(s.disp.cold)-len(s.disp.cold))
	if _, err := s.sweep(ctx, room); err != nil {
		s.log.Warn("claim the events of ordering keys; the poll retries", slog.Any("error", err))
	}
}

// take adds n to q unless it names a key this instance holds past the
// event that named it.
func (s *sequencer) take(q *namings, n named) {
	if n.past > 0 && s.disp.keys.holdsAfter(n.key, n.past) {
		return
	}
	q.add(n)
}

// namings is what the sequencer's run collects between claims: the keys
// to claim, the finished events to record, and the keys held quiet.
type namings struct {
	batch map[string]struct{}
	done  []driver.KeyDone
	quiet map[string]time.Time // key → claims held back until
	later map[string]struct{}  // namings held back
	wake  *time.Timer
	armed time.Time // when wake fires; zero: stopped
}

func newNamings() *namings {
	q := &namings{batch: map[string]struct{}{}, quiet: map[string]time.Time{}, later: map[string]struct{}{}, wake: time.NewTimer(time.Hour)}
	q.wake.Stop()
	return q
}

func (q *namings) arm(at time.Time) {
	if q.armed.IsZero() || at.Before(q.armed) {
		q.armed = at
		q.wake.Reset(time.Until(at))
	}
}

// add takes one naming.
func (q *namings) add(n named) {
	switch {
	case !n.quiet.IsZero():
		if len(q.quiet) >= maxQuietKeys {
			clear(q.quiet)
			for k := range q.later {
				q.batch[k] = struct{}{}
			}
			clear(q.later)
		}
		q.quiet[n.key] = n.quiet
	case n.ev.EventID != "":
		delete(q.quiet, n.key)
		if _, ok := q.later[n.key]; ok {
			delete(q.later, n.key)
			q.batch[n.key] = struct{}{}
		}
		if !n.held {
			q.batch[n.key] = struct{}{}
		}
	default:
		if until, ok := q.quiet[n.key]; ok && time.Now().Before(until) {
			if _, ok := q.later[n.key]; !ok {
				q.later[n.key] = struct{}{}
				q.arm(until)
			}
			break
		}
		delete(q.quiet, n.key)
		q.batch[n.key] = struct{}{}
	}
	if n.ev.EventID != "" {
		q.done = append(q.done, n.ev)
	}
}

// fired moves the namings held back whose quiet has ended to the batch,
// and arms the timer for the next.
func (q *namings) fired(now time.Time) {
	q.armed = time.Time{}
	for k := range q.later {
		if until := q.quiet[k]; !now.Before(until) {
			delete(q.later, k)
			delete(q.quiet, k)
			q.batch[k] = struct{}{}
		} else {
			q.arm(until)
		}
	}
}

// keysDone tells the store which ordered events finished, so that the
// next event of their keys may take the hot path.
func (s *sequencer) keysDone(ctx context.Context, evs []driver.KeyDone) {
	if len(evs) == 0 || s.ostore == nil {
		return
	}
	ctx, cancel := s.storeCtx()
	defer cancel()
	start := time.Now()
	err := s.ostore.KeysDone(ctx, evs, s.reg.load().orderFilter())
	s.m.Statement("keys_done", len(evs), time.Since(start))
	if err != nil {
		// A hint only: the keys' next events go the cold way.
		s.log.Warn("record finished ordered events on their keys", slog.Int("events", len(evs)), slog.Any("error", err))
	}
}

// claim leases the heads of keys, at most most of them, and queues them;
// it returns how many events it queued, and how many heads it leased.
func (s *sequencer) claim(ctx context.Context, keys []string, most int) (queued, heads int) {
	if len(keys) == 0 || most <= 0 {
		return 0, 0
	}
	reg := s.reg.load()
	// As the poll's: a claim that started runs to its end (or to the
	// engine's life's).
	ctx, cancel := s.storeCtx()
	defer cancel()
	start := time.Now()
	req := driver.ClaimRequest{Owner: s.cfg.InstanceID, Limit: most, Lease: s.cfg.Lease, Run: s.cfg.ColdQueueSize}
	rows, err := s.ostore.ClaimHeads(ctx, req, keys, reg.orderFilter())
	s.m.Statement("claim_heads", len(rows), time.Since(start))
	if err != nil {
		s.log.Error("claim the next events of ordering keys; the poll retries", slog.Int("keys", len(keys)), slog.Any("error", err))
		return 0, 0
	}
	follows := followers(rows)
	for _, f := range follows {
		if !f {
			heads++
		}
	}
	queued, unqueued, unhandled := s.disp.offerRows(ctx, reg, rows, follows, time.Now(), start)
	for i := range rows {
		if _, err := decode(&rows[i]); err != nil {
			s.sig.name(rows[i].OrderingKey) // buried: the key goes on, or is blocked
		}
	}
	s.disp.leases.releaseLeases(ctx, unqueued, "release unqueued events")
	s.disp.leases.release(ctx, unhandled, s.cfg.NoListenerDelay, "hand back events with no listener here")
	if queued > 0 {
		s.m.ColdEnqueued(queued)
		s.comp.sharedAt.Store(time.Now().UnixNano()) // events of ordered keys waited in the table: lingerNow
	}
	return queued, heads
}

// followers sorts rows, the heads and runs of a claim, by key and number,
// and reports which follow the row before them in their key.
func followers(rows []driver.Row) []bool {
	slices.SortStableFunc(rows, byKeyNumber)
	follows := make([]bool, len(rows))
	for i := 1; i < len(rows); i++ {
		follows[i] = rows[i].KeySeq > 0 && rows[i].OrderingKey == rows[i-1].OrderingKey
	}
	return follows
}

// byKeyNumber orders rows by ordering key, then by number in the key.
func byKeyNumber(a, b driver.Row) int {
	return cmp.Or(strings.Compare(a.OrderingKey, b.OrderingKey), cmp.Compare(a.KeySeq, b.KeySeq))
}

// sweep claims the heads of keys with events due, up to limit events
// and as many keys as keysPerWorker leaves room for, going round the keys
// so that keys blocked by a dead event cannot crowd out the others. The
// poller calls it, and refill.
func (s *sequencer) sweep(ctx context.Context, limit int) (int, error) {
	if s.ostore == nil || limit <= 0 || len(s.reg.load().local) == 0 {
		return 0, nil
	}
	most := min(limit, keysPerWorker*s.cfg.Workers-s.disp.keys.claimedKeys())
	bound := most < limit
	s.mu.Lock()
	after := s.after
	s.full = bound && most <= 0
	s.mu.Unlock()
	if most <= 0 {
		return 0, nil
	}
	qctx, cancel := s.storeCtx()
	keys, err := s.ostore.DueKeys(qctx, after, limit)
	cancel()
	if err != nil {
		return 0, err
	}
	queued, heads := s.claim(ctx, keys, most)
	s.mu.Lock()
	if len(keys) < limit {
		s.after = "" // round again from the first key next time
	} else {
		s.after = keys[len(keys)-1]
	}
	s.full = bound && heads >= most
	s.mu.Unlock()
	return queued, nil
}

func errNoOrderedStore(store driver.Store) error {
	return fmt.Errorf("outbox: ordered subscriptions need a store that orders events by key, and %T does not implement driver.OrderedStore: use sqlstore (MySQL/MariaDB, PostgreSQL, SQLite)", store)
}

// --- operations ---

// BlockedKey is an ordering key whose earliest event pending for an
// Ordered subscription is dead for it: the key's later events wait for
// that subscription (BlockedKey.Subscription) until the event is replayed
// or skipped.
type BlockedKey = driver.BlockedKey

// BlockedKeys returns up to limit (0: 100) blocked keys greater than
// after, in key order. It needs a store that orders events
// (driver.OrderedStore); with no Ordered subscription here it returns
// none.
func (o *Outbox) BlockedKeys(ctx context.Context, after string, limit int) ([]BlockedKey, error) {
	os, ok := o.store.(driver.OrderedStore)
	if !ok {
		return nil, nil
	}
	if limit <= 0 {
		limit = 100
	}
	return os.BlockedKeys(ctx, o.reg.load().orderFilter(), after, limit)
}

// SkipDead gives up for good on the dead events among ids (and on the dead
// deliveries of the given events): they become DONE, keeping their last
// error, and the keys they blocked go on at once. It returns how many
// events and deliveries it changed. Use Outbox.Replay to deliver them again
// instead.
func (o *Outbox) SkipDead(ctx context.Context, ids ...string) (int, error) {
	os, ok := o.store.(driver.OrderedStore)
	if !ok {
		return 0, errNoOrderedStore(o.store)
	}
	n, err := os.SkipDead(ctx, ids)
	if n > 0 {
		o.poller.wake()
	}
	return n, err
}
