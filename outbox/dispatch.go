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

// dispatcher delivers events to subscriptions: it owns the hot queue
// (events handed over at commit), the cold queue (events the poller
// claimed), the in-flight set (everything this instance holds), the
// workers that take from the queues, and the batchers of Batch
// subscriptions. What it delivered goes to the completer; what it gives
// back goes through the lease keeper.
type dispatcher struct {
	*deps
	reg    *registrar
	comp   *completer
	leases *leaseKeeper
	sig    *signals // to the poller and the sequencer, which feed it
	keys   *keyTable
	hooks  *hooks // the failure hooks, called once a failure is written

	hot, cold chan *item
	coldSpace chan struct{} // a worker took a cold item; capacity 1
	draining  chan struct{} // closed when Close begins: workers finish what is queued and stop

	// refused: events whose completing write the store refused for a
	// stale registry and that could not be written anew, from the
	// completer, for watchChains to take out of this instance's hands
	// (registryChanged); chainsDone is closed when watchChains has
	// returned, and nothing reads refused any more.
	refused    chan staleRefusal
	chainsDone chan struct{}

	cancel     context.CancelFunc // cancels the handlers' contexts
	workers    sync.WaitGroup
	batchers   sync.WaitGroup
	gates      sync.WaitGroup // the gates of subscriptions with a Rate
	stragglers sync.WaitGroup // handler calls, including those abandoned after their timeout
	running    atomic.Int64   // handler calls not yet returned
}

func newDispatcher(d *deps) *dispatcher {
	return &dispatcher{
		deps:       d,
		keys:       newKeyTable(),
		hot:        make(chan *item, d.cfg.HotQueueSize),
		cold:       make(chan *item, d.cfg.ColdQueueSize),
		coldSpace:  make(chan struct{}, 1),
		draining:   make(chan struct{}),
		refused:    make(chan staleRefusal, 16),
		chainsDone: make(chan struct{}),
	}
}

// idle reports whether nothing is queued or in flight here (an item
// leaves the in-flight set once its outcome is recorded).
func (d *dispatcher) idle() bool {
	return len(d.hot) == 0 && len(d.cold) == 0 && d.leases.holdsNone()
}

// start launches the workers, one batcher per Batch subscription and one
// gate per subscription with a Rate.
func (d *dispatcher) start(ctx context.Context, subs []*subscription) {
	ctx, d.cancel = context.WithCancel(ctx)
	for _, s := range subs {
		if s.Batch != nil {
			s.batch = newBatcher(d, s)
			d.batchers.Go(func() { s.batch.run(ctx) })
		}
		if s.Rate > 0 {
			s.gate = newGate(d, s)
			d.gates.Go(func() { s.gate.run(ctx) })
		}
	}
	for range d.cfg.Workers {
		d.workers.Go(func() { d.work(ctx) })
	}
	d.workers.Go(func() { d.watchChains(ctx) })
}

// drain stops the dispatcher: the workers deliver what is queued until ctx
// ends (then the handlers' contexts are cancelled), the batchers flush
// what they hold, and whatever is left in the queues is handed back to the
// database.
//
// It reports which of them it stopped waiting for at the end of Close's
// patience (see runner.stop): a worker inside a database call that
// ignores its context. Such a worker finds the completer and the batchers
// closed when it comes back, and what it finished is delivered again once
// its lease runs out.
func (d *dispatcher) drain(ctx context.Context, subs []*subscription) (stuck []string) {
	close(d.draining)
	if !d.wait(ctx, &d.workers) {
		stuck = append(stuck, "workers")
	}
	// Limited subscriptions get nothing new now: their gates postpone
	// what they hold (it waited for a token, not for a handler) and wait
	// for the calls they started; before the batchers close, since a gate
	// passes its events to its subscription's batcher.
	for _, s := range subs {
		if s.gate != nil {
			s.gate.close()
		}
	}
	if !d.wait(ctx, &d.gates) {
		stuck = append(stuck, "gates")
	}
	// Batch subscriptions get nothing new now: flush what they hold. An
	// outcome cut by the cancellation puts its item back in a queue,
	// which handBack then empties.
	for _, s := range subs {
		if s.batch != nil {
			s.batch.close()
		}
	}
	if !d.wait(ctx, &d.batchers) {
		stuck = append(stuck, "batchers")
	}
	d.handBack()
	return stuck
}

// wait waits for wg; if ctx ends first, it cancels the handlers and
// waits for wg still, until Close's patience ends. It reports whether wg
// was done.
func (d *dispatcher) wait(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		d.cancel()
	}
	return waitUntil(done, d.patience)
}

// closeGrace is how long Close waits, after its own context ended, for
// handler calls whose context it cancelled.
const closeGrace = time.Second

// waitStragglers cancels the handlers' contexts and waits for the handler
// calls still running (abandoned after their timeout, or cut by Close):
// until ctx ends, then a short grace for those that honour cancellation.
func (d *dispatcher) waitStragglers(ctx context.Context) error {
	if d.cancel == nil {
		return nil
	}
	d.cancel()
	if d.running.Load() == 0 {
		d.stragglers.Wait() // only the last deferred Done calls remain
		return nil
	}
	done := make(chan struct{})
	go func() { d.stragglers.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	// The handlers' contexts are cancelled by now. Give those that honour
	// cancellation a moment to return, so that a handler which does the
	// right thing is never reported as ignoring its context.
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-done:
		return nil
	case <-grace.C:
		return fmt.Errorf("outbox: close: %d listener calls that ignored their context are still running: %w", d.running.Load(), ctx.Err())
	}
}

func (d *dispatcher) work(ctx context.Context) {
	for {
		var it *item
		select {
		case it = <-d.hot:
		default:
			select {
			case it = <-d.hot:
			case it = <-d.cold:
			case <-ctx.Done():
				return
			case <-d.draining:
				select {
				case it = <-d.hot:
				case it = <-d.cold:
				default:
					return
				}
			}
		}
		if it.path == PathCold {
			select {
			case d.coldSpace <- struct{}{}:
			default:
			}
		}
		if ctx.Err() != nil {
			// Stopping: put it back for handBack. There is room, since
			// it just came out and nothing else sends after Close.
			d.requeue(it)
			return
		}
		d.process(ctx, it)
	}
}

func (d *dispatcher) requeue(it *item) {
	q := d.hot
	if it.path == PathCold {
		q = d.cold
	}
	select {
	case q <- it:
	default:
		d.leases.letGo(it.key())
	}
}

// offerCold puts a claimed item in the cold queue unless it is in hand
// here already (the claim could take it only if its lease had run out
// while renewals failed, and it is still this instance's to finish) or
// the queue is full.
func (d *dispatcher) offerCold(it *item) offerResult { return d.offer(it, d.cold) }

// offerRefill is offerCold for what the poller claimed to refill a gate
// (refillGates): it goes to the hot queue, which the workers take first,
// so that it reaches the gate before the next poll, which would otherwise
// see the gate as empty as before and claim its room again (to be
// deferred), while the refill waited behind a cold queue full of other
// events.
func (d *dispatcher) offerRefill(it *item) offerResult { return d.offer(it, d.hot) }

func (d *dispatcher) offer(it *item, q chan *item) offerResult {
	if !d.leases.hold(it.key(), d.leaseEnd(it)) {
		return offerInHand
	}
	if chained(it) {
		d.keys.claimed(it) // before a worker can finish it
	}
	select {
	case q <- it:
		return offerQueued
	default:
		if chained(it) {
			// Events published since claimed may wait behind it.
			if back := d.keys.failed(it); len(back) > 0 {
				d.giveBack(it.env.OrderingKey, back...)
			}
		}
		d.leases.letGo(it.key())
		return offerFull
	}
}

// offerFollower takes it, an ordered event a claim leased behind the
// event before it in its key (a run of ClaimHeads): it waits in its key's
// chain behind that event, goes to the hot queue if that event was
// delivered here already, or is refused (offerFull: its lease is to be
// released) if that event is not in this instance's hands, e.g. it could
// not be queued.
func (d *dispatcher) offerFollower(it *item) offerResult {
	if !d.leases.hold(it.key(), d.leaseEnd(it)) {
		return offerInHand
	}
	switch d.keys.committed(it, false) {
	case commitGo:
		d.pushChained(it)
	case commitWait:
		// In the in-flight set: its lease is renewed while it waits.
	default:
		d.leases.letGo(it.key())
		return offerFull
	}
	if it.sub == nil {
		// An event of the key published here meanwhile is leased here
		// behind it (Row.KeyAfter) and joins the chain.
		d.keys.leased(it.env.OrderingKey, it.env.seq)
	}
	return offerQueued
}

// handBack empties the queues and the chains of ordered events waiting
// behind others, and returns how many events it took. Close releases
// their leases afterwards with everything else this instance holds
// (releaseHeld); a store that cannot release by owner has them released
// here, by id, under the same bound.
func (d *dispatcher) handBack() int {
	var items []*item
	for {
		var it *item
		select {
		case it = <-d.hot:
		case it = <-d.cold:
		default:
		}
		if it == nil {
			break
		}
		items = append(items, it)
	}
	// Events committed (or claimed) behind others of their keys, never
	// queued.
	items = append(items, d.keys.drain()...)
	if len(items) == 0 {
		return 0
	}
	if _, ok := d.store.(driver.OwnerReleaser); !ok {
		ids, keys := leaseNames(items)
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		d.leases.releaseLeases(ctx, ids, "release leases on close")
		d.leases.releaseDeliveries(ctx, keys, 0, "release deliveries on close")
	}
	for _, it := range items {
		d.leases.letGo(it.key())
	}
	d.log.Info("handed queued events back to the database", slog.Int("events", len(items)))
	return len(items)
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
func (d *dispatcher) enqueueHot(env Envelope, written time.Time) {
	it := d.committed(env, written)
	if it == nil {
		return
	}
	select {
	case d.hot <- it:
		d.m.HotEnqueued()
	default:
		d.leases.letGo(env.ID)
		// The row is leased to this instance from its insert, freshly:
		// no poller can have claimed it. The poller releases it so that
		// it is due at once.
		d.m.HotDropped()
		d.log.Warn("hot queue full; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)), slog.Int("capacity", cap(d.hot)))
		d.dropToPoller(env.ID)
	}
}

// committed returns the hot item of an event leased to this instance
// whose transaction committed, now in the in-flight set; or nil if it
// committed too late for its lease (see enqueueHot) or is in hand here
// already.
func (d *dispatcher) committed(env Envelope, written time.Time) *item {
	it := &item{env: env, path: PathHot, since: time.Now(), leased: written}
	if age := it.since.Sub(written); age > d.cfg.Lease/2 {
		// Not released early either: this instance's poller may already
		// have claimed the row, and a release would take it back from
		// under that delivery. A poller takes it when the lease ends.
		d.m.HotDropped()
		d.log.Warn("transaction committed late: its lease may have run out; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)),
			slog.Duration("since_written", age), slog.Duration("lease", d.cfg.Lease))
		return nil
	}
	if !d.leases.hold(env.ID, d.leaseEnd(it)) {
		return nil
	}
	return it
}

// leaseEnd is the time until which it's lease surely holds, unless
// renewed: a Lease after it was leased (zero if that is not known).
func (d *dispatcher) leaseEnd(it *item) time.Time {
	if it.leased.IsZero() {
		return time.Time{}
	}
	return it.leased.Add(d.cfg.Lease)
}

// handBackLate releases the lease of an event committed after Close
// began, unless this instance still has it in hand.
func (d *dispatcher) handBackLate(id string) {
	if d.leases.holds(id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	d.leases.releaseLeases(ctx, []string{id}, "release an event committed after close")
	d.log.Debug("outbox closed; event committed after close handed back to the table", slog.String("event_id", id))
}

// offerRows offers claimed events to the cold queue: it buries those that
// cannot be decoded, and returns how many it queued, those the full queue
// refused and those no subscription here takes, for the caller to hand
// back.
//
// With follows (ClaimHeads' runs), rows[i] with follows[i] set is an
// ordered event leased behind the row before it, its predecessor in its
// key: it waits in its key's chain (offerFollower).
func (d *dispatcher) offerRows(ctx context.Context, reg *registry, rows []driver.Row, follows []bool, now, leased time.Time) (queued int, unqueued, unhandled []string) {
	return d.offerRowsTo(ctx, reg, rows, follows, now, leased, d.offerCold)
}

// offerRowsTo is offerRows through offer (offerCold or offerRefill).
func (d *dispatcher) offerRowsTo(ctx context.Context, reg *registry, rows []driver.Row, follows []bool, now, leased time.Time, offer func(*item) offerResult) (queued int, unqueued, unhandled []string) {
	for i := range rows {
		r := &rows[i]
		env, err := decode(r)
		if err != nil {
			d.bury(ctx, r, err)
			continue
		}
		if !reg.has(env.Type) && len(reg.owedElsewhere(env.Type)) > 0 {
			d.reg.noListener(r.ID, env.Type)
			unhandled = append(unhandled, r.ID)
			continue
		}
		it := &item{env: env, path: PathCold, attempts: r.Attempts, since: createdOr(r, now), behind: r.Behind, leased: leased}
		to := offer
		if follows != nil && follows[i] && env.ordered {
			to = d.offerFollower
		}
		switch to(it) {
		case offerQueued:
			queued++
		case offerFull:
			unqueued = append(unqueued, r.ID)
		}
	}
	return queued, unqueued, unhandled
}

// bury marks an undecodable row DEAD: no attempt can ever succeed.
func (d *dispatcher) bury(ctx context.Context, r *driver.Row, cause error) {
	var de *DecodeError
	reason := "undecodable row"
	if errors.As(cause, &de) {
		reason = de.Error()
	}
	reason = errorText(reason)
	d.log.Error("event is dead: stored row cannot be decoded", slog.String("event_id", r.ID), slog.String("reason", reason))
	d.m.Dispatched(EventType(r.Type), PathCold, OutcomeDead, 0)
	if _, err := retryStore(ctx, func() (bool, error) { return d.store.MarkDead(ctx, d.cfg.InstanceID, r.ID, reason) }); err != nil {
		d.log.Error("mark undecodable event dead", slog.String("event_id", r.ID), slog.Any("error", err))
	}
}
