package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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
	poller *poller

	hot, cold chan *item
	inflight  inflightSet
	coldSpace chan struct{} // a worker took a cold item; capacity 1
	draining  chan struct{} // closed when Close begins: workers finish what is queued and stop

	cancel     context.CancelFunc // cancels the handlers' contexts
	workers    sync.WaitGroup
	batchers   sync.WaitGroup
	stragglers sync.WaitGroup // handler calls, including those abandoned after their timeout
	running    atomic.Int64   // handler calls not yet returned
}

func newDispatcher(d *deps) *dispatcher {
	return &dispatcher{
		deps:      d,
		hot:       make(chan *item, d.cfg.HotQueueSize),
		cold:      make(chan *item, d.cfg.ColdQueueSize),
		inflight:  inflightSet{m: make(map[string]struct{})},
		coldSpace: make(chan struct{}, 1),
		draining:  make(chan struct{}),
	}
}

// start launches the workers and one batcher per Batch subscription.
func (d *dispatcher) start(ctx context.Context, subs []*subscription) {
	ctx, d.cancel = context.WithCancel(ctx)
	for _, s := range subs {
		if s.Batch != nil {
			s.batch = newBatcher(d, s)
			d.batchers.Go(func() { s.batch.run(ctx) })
		}
	}
	for range d.cfg.Workers {
		d.workers.Go(func() { d.work(ctx) })
	}
}

// drain stops the dispatcher: the workers deliver what is queued until ctx
// ends (then the handlers' contexts are cancelled), the batchers flush
// what they hold, and whatever is left in the queues is handed back to the
// database.
func (d *dispatcher) drain(ctx context.Context, subs []*subscription) {
	close(d.draining)
	d.wait(ctx, &d.workers)
	// Batch subscriptions get nothing new now: flush what they hold. An
	// outcome cut by the cancellation puts its item back in a queue,
	// which handBack then empties.
	for _, s := range subs {
		if s.batch != nil {
			close(s.batch.in)
		}
	}
	d.wait(ctx, &d.batchers)
	d.handBack()
}

// wait waits for wg; if ctx ends first, it cancels the handlers and
// waits for wg still.
func (d *dispatcher) wait(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		d.cancel()
		<-done
	}
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

// item is one event on its way through the engine: to every subscription
// of this instance that takes it (an event from the hot path or the
// event claim), or to one subscription (a delivery claimed from the
// DeliveryStore).
type item struct {
	env      Envelope
	path     Path
	attempts int       // failed attempts before this one
	since    time.Time // commit (hot) or insert (cold) time
	sub      *subscription

	// The join of the subscriptions' outcomes.
	mu      sync.Mutex
	pending int
	results []result
	start   time.Time
}

// key is the item's name in the in-flight set.
func (it *item) key() string {
	if it.sub == nil {
		return it.env.ID
	}
	return deliveryKeyString(it.env.ID, it.sub.Name)
}

func deliveryKeyString(id, sub string) string { return id + "\x00" + sub }

func parseDeliveryKey(k string) (driver.DeliveryKey, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return driver.DeliveryKey{EventID: k[:i], Subscription: k[i+1:]}, true
		}
	}
	return driver.DeliveryKey{}, false
}

type resultKind int8

const (
	resDone      resultKind = iota
	resRetry                // failed; another attempt after delay
	resDead                 // failed for the last time
	resDefer                // not attempted or unavailable: due again after delay, attempts unchanged
	resCancelled            // cut by shutdown: hand the whole item back
)

func (k resultKind) outcome() Outcome {
	switch k {
	case resRetry:
		return OutcomeRetry
	case resDead:
		return OutcomeDead
	case resDefer:
		return OutcomeDeferred
	}
	return OutcomeDone
}

type result struct {
	sub      string
	kind     resultKind
	recorded bool // done, and recorded already (a Tx subscription)
	delay    time.Duration
	attempts int
	err      string
}

func (it *item) add(r result) {
	it.mu.Lock()
	it.results = append(it.results, r)
	it.mu.Unlock()
}

// PanicError is the error of a handler that panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("outbox: handler panicked: %v", e.Value) }

func safeCall(ctx context.Context, f func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return f(ctx)
}

// --- batches ---

type task struct {
	it    *item
	ev    Event
	probe bool
}

// batcher collects the events of one Batch subscription and calls it with
// up to BatchSize of them at a time, at most Concurrency calls at once.
type batcher struct {
	d   *dispatcher
	s   *subscription
	in  chan task
	wg  sync.WaitGroup
	ctx context.Context
}

func newBatcher(d *dispatcher, s *subscription) *batcher {
	return &batcher{d: d, s: s, in: make(chan task, 2*s.BatchSize)}
}

// add queues t; it reports false if ctx ended first.
func (b *batcher) add(ctx context.Context, t task) bool {
	select {
	case b.in <- t:
		return true
	case <-ctx.Done():
		return false
	}
}

// run collects batches until in is closed, then flushes what is left.
func (b *batcher) run(ctx context.Context) {
	b.ctx = ctx
	g := newGatherer(b.in, b.s.BatchSize, b.s.BatchLinger)
	for {
		batch, ok := g.next(nil)
		if !ok {
			break
		}
		b.s.sem <- struct{}{}
		b.wg.Go(func() {
			defer func() { <-b.s.sem }()
			b.deliver(batch)
		})
	}
	b.wg.Wait()
}

func (b *batcher) deliver(batch []task) {
	evs := make([]Event, len(batch))
	for i, t := range batch {
		evs[i] = t.ev
		evs[i].Subscription = b.s.Name
	}
	start := time.Now()
	err := b.d.call(b.ctx, b.s.Timeout, b.d.interceptDeliver(b.s.Name, evs, func(ctx context.Context) error { return b.s.Batch(ctx, evs) }))
	took := time.Since(start)
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) != len(batch) {
		err = fmt.Errorf("outbox: batch handler of %q returned %d outcomes for %d events", b.s.Name, len(be.Errs), len(batch))
		be = nil
	}
	for i, t := range batch {
		e := err
		if be != nil {
			e = be.Errs[i]
		}
		t.it.add(b.d.outcome(b.ctx, b.s, t.it, t.probe, e, took))
		b.d.settle(t.it)
	}
}

// process delivers one item to its subscriptions and, once every outcome
// is in (batch subscriptions report later), records them.
func (d *dispatcher) process(ctx context.Context, it *item) {
	it.start = time.Now()
	if it.attempts == 0 && it.sub == nil {
		d.m.Latency(it.path, it.start.Sub(it.since))
	}
	reg := d.reg.load()
	var targets []*subscription
	var owed []string
	if it.sub != nil {
		targets = []*subscription{it.sub}
	} else {
		targets = reg.match(it.env.Type)
		if len(targets) == 0 {
			// Never complete what no subscription here accepted: give it
			// back for an instance that has one (no attempt spent).
			d.reg.noListener(it.env.ID, it.env.Type)
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			d.leases.release(ctx, []string{it.env.ID}, d.cfg.NoListenerDelay, "hand back an event with no subscription here")
			cancel()
			d.inflight.release(it.key())
			return
		}
		owed = reg.owedElsewhere(it.env.Type)
	}
	ev := Event{Envelope: it.env, Attempt: it.attempts + 1, Path: it.path}
	it.pending = 1 // this call's own share, settled at the end
	it.results = make([]result, 0, len(targets)+len(owed))
	for _, s := range targets {
		if reg.paused[s.Name] {
			d.m.Delivered(s.Name, OutcomeDeferred, 0)
			it.add(result{sub: s.Name, kind: resDefer, attempts: it.attempts})
			continue
		}
		ok, probe, wait := s.circuit.acquire(time.Now())
		if !ok {
			d.m.Delivered(s.Name, OutcomeDeferred, 0)
			it.add(result{sub: s.Name, kind: resDefer, delay: wait, attempts: it.attempts})
			continue
		}
		if s.batch != nil {
			it.mu.Lock()
			it.pending++
			it.mu.Unlock()
			if !s.batch.add(ctx, task{it: it, ev: ev, probe: probe}) {
				s.circuit.release(probe)
				it.add(result{sub: s.Name, kind: resCancelled})
				d.settle(it)
			}
			continue
		}
		ev.Subscription = s.Name
		start := time.Now()
		if s.Tx != nil {
			err := d.callTx(ctx, s, ev)
			r := d.outcome(ctx, s, it, probe, err, time.Since(start))
			r.recorded = err == nil
			it.add(r)
			continue
		}
		err := d.callOne(ctx, s, ev)
		it.add(d.outcome(ctx, s, it, probe, err, time.Since(start)))
	}
	for _, name := range owed {
		it.add(result{sub: name, kind: resDefer, attempts: it.attempts})
	}
	d.settle(it)
}

// settle counts one share of the item as finished and records the
// outcomes once the last share is in.
func (d *dispatcher) settle(it *item) {
	it.mu.Lock()
	it.pending--
	last := it.pending == 0
	it.mu.Unlock()
	if last {
		d.finish(it)
	}
}

// outcome turns a call's error into the subscription's result, updating
// its circuit.
func (d *dispatcher) outcome(ctx context.Context, s *subscription, it *item, probe bool, err error, took time.Duration) (r result) {
	r = result{sub: s.Name, attempts: it.attempts}
	defer func() {
		if r.kind != resCancelled {
			d.m.Delivered(s.Name, r.kind.outcome(), took)
		}
	}()
	now := time.Now()
	if err == nil {
		if s.circuit.success() {
			// What waited for the circuit is due now, not at its probe time.
			dctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			n, err := d.dstore.DueNow(dctx, s.Name)
			cancel()
			if err != nil {
				d.log.Error("make the deliveries deferred by the circuit due", slog.String("subscription", s.Name), slog.Any("error", err))
			}
			d.poller.wake()
			d.m.Circuit(s.Name, CircuitClosed)
			d.log.Info("deliveries deferred while the destination was down are due", slog.String("subscription", s.Name), slog.Int("deliveries", n))
			d.log.Info("destination back: circuit closed", slog.String("subscription", s.Name))
		}
		return r // resDone
	}
	if ctx.Err() != nil {
		// Shutdown cancelled the call: not the event's fault.
		s.circuit.release(probe)
		r.kind = resCancelled
		return r
	}
	if down, retryAfter := IsUnavailable(err); down {
		wait, opened := s.circuit.unavailable(now, retryAfter, probe)
		if opened {
			d.m.Circuit(s.Name, CircuitOpen)
			d.log.Warn("destination unavailable: circuit open, events wait without spending attempts",
				slog.String("subscription", s.Name), slog.Duration("probe_in", wait), slog.String("error", errorText(err.Error())))
		}
		r.kind, r.delay, r.err = resDefer, wait, errorText(err.Error())
		return r
	}
	s.circuit.failure(probe)
	r.attempts = it.attempts + 1
	r.err = errorText(err.Error())
	if s.Classify(err) == DecisionDead || r.attempts >= s.MaxAttempts {
		r.kind = resDead
	} else {
		r.kind, r.delay = resRetry, s.Retry.Delay(r.attempts)
	}
	return r
}

// finish records the outcomes of an item whose subscriptions have all
// answered.
func (d *dispatcher) finish(it *item) {
	took := time.Since(it.start)
	done, cancelled := true, false
	outcome := OutcomeDone
	for _, r := range it.results {
		switch r.kind {
		case resDone:
			continue
		case resCancelled:
			cancelled = true
		case resDead:
			outcome = OutcomeDead
		case resRetry:
			if outcome != OutcomeDead {
				outcome = OutcomeRetry
			}
		}
		done = false
	}
	if cancelled {
		d.requeue(it)
		return
	}
	if done {
		d.m.Dispatched(it.env.Type, it.path, OutcomeDone, took)
		if it.sub != nil && it.results[0].recorded {
			// A Tx subscription's delivery: recorded in its own
			// transaction already.
			d.inflight.release(it.key())
			return
		}
		d.comp.add(it) // the completer releases it after the write
		return
	}
	if outcome != OutcomeDone {
		d.m.Dispatched(it.env.Type, it.path, outcome, took)
	}
	d.recordFailures(it)
}

// recordFailures writes the state of the subscriptions that did not
// deliver the item.
func (d *dispatcher) recordFailures(it *item) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	var writes []driver.DeliveryWrite
	var wake time.Duration = -1
	for _, r := range it.results {
		w := driver.DeliveryWrite{Subscription: r.sub, Attempts: r.attempts, Delay: r.delay, Error: r.err}
		attrs := []any{slog.String("event_id", it.env.ID), slog.String("event_type", string(it.env.Type)),
			slog.String("subscription", r.sub), slog.String("path", string(it.path))}
		switch r.kind {
		case resDone:
			continue
		case resRetry:
			w.Status = driver.StatusRetry
			d.log.Warn("delivery failed; will retry", append(attrs, slog.Int("attempt", r.attempts), slog.Duration("retry_in", r.delay), slog.String("error", r.err))...)
		case resDead:
			w.Status = driver.StatusDead
			d.log.Error("delivery is dead: failed for the last time", append(attrs, slog.Int("attempt", r.attempts), slog.String("error", r.err))...)
		case resDefer:
			w.Status = driver.StatusNew
			if r.err != "" {
				d.log.Debug("destination unavailable; delivery deferred without an attempt", append(attrs, slog.Duration("retry_in", r.delay), slog.String("error", r.err))...)
			}
		}
		if w.Status != driver.StatusDead && (wake < 0 || r.delay < wake) {
			wake = r.delay
		}
		writes = append(writes, w)
	}
	// The item leaves this instance's hands with the write that gives up
	// its lease: from then on a claim (here too) may take it again, and
	// must find it free in the in-flight set. Until the write, the live
	// lease keeps every claim off it.
	d.inflight.release(it.key())
	write := func(writes []driver.DeliveryWrite) (bool, error) {
		start := time.Now()
		name := "split"
		if it.sub != nil {
			name = "fail_delivery"
		}
		defer func() { d.m.Statement(name, len(writes), time.Since(start)) }()
		return retryStore(ctx, func() (bool, error) {
			if it.sub == nil {
				return d.dstore.Split(ctx, d.cfg.InstanceID, it.env.ID, writes)
			}
			return d.dstore.FailDelivery(ctx, d.cfg.InstanceID, driver.DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name}, writes[0])
		})
	}
	held, err := write(writes)
	if err != nil && ctx.Err() == nil {
		// The database refused the outcome itself (the text, a column, a
		// trigger): record it with a text it cannot refuse, so that
		// attempts still advance and the delivery reaches DEAD rather
		// than being tried again every lease.
		d.log.Error("record failed delivery; recording it without the error text", slog.String("event_id", it.env.ID), slog.Any("error", err))
		for i := range writes {
			if writes[i].Error != "" {
				writes[i].Error = errorText("outbox: the handler's error could not be stored: " + err.Error())
			}
		}
		if held, err = write(writes); err != nil {
			for i := range writes {
				if writes[i].Error != "" {
					writes[i].Error = "outbox: the handler's error could not be stored"
				}
			}
			held, err = write(writes)
		}
	}
	switch {
	case err != nil:
		d.log.Error("record failed delivery; the event is delivered again when its lease expires", slog.String("event_id", it.env.ID), slog.Any("error", err))
	case !held:
		d.log.Warn("lease lost: another instance owns the event; outcome not recorded", slog.String("event_id", it.env.ID))
	case wake >= 0:
		d.poller.scheduleRetryWake(time.Now().Add(wake))
	}
}

// callOne runs a Handler within the subscription's concurrency limit.
func (d *dispatcher) callOne(ctx context.Context, s *subscription, ev Event) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	f := func(ctx context.Context) error { return s.Handler(ctx, ev) }
	if len(d.cfg.Interceptors) > 0 {
		f = d.interceptDeliver(s.Name, []Event{ev}, f)
	}
	return d.call(ctx, s.Timeout, f)
}

// callTx runs a Tx handler in a transaction that records its delivery.
func (d *dispatcher) callTx(ctx context.Context, s *subscription, ev Event) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	ts := d.store.(driver.TxDeliveryStore) // checked by Subscribe
	f := func(ctx context.Context) error {
		already, err := ts.DeliverInTx(ctx, ev.ID, s.Name, func(tx DBTx) error {
			return safeCall(ctx, func(ctx context.Context) error { return s.Tx(ctx, tx, ev) })
		})
		if already {
			d.log.Debug("delivery recorded already; not run again", slog.String("event_id", ev.ID), slog.String("subscription", s.Name))
		}
		return err
	}
	if len(d.cfg.Interceptors) > 0 {
		f = d.interceptDeliver(s.Name, []Event{ev}, f)
	}
	return d.call(ctx, s.Timeout, f)
}

// call runs a handler with a timeout, containing panics. A handler that
// ignores its cancelled context is abandoned: the caller moves on, and
// Close waits for the abandoned call.
// handlerGrace is how long a call whose context ended waits for the
// handler's own result before it gives up on it.
const handlerGrace = 50 * time.Millisecond

func (d *dispatcher) call(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	if timeout < 0 {
		return safeCall(ctx, f)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	var state atomic.Int32 // 0 running, 1 abandoned, 2 returned in time
	d.stragglers.Add(1)
	d.running.Add(1)
	go func() {
		defer d.stragglers.Done()
		defer d.running.Add(-1) // runs before Done: see Close
		done <- safeCall(ctx, f)
		if !state.CompareAndSwap(0, 2) {
			d.health.abandoned.Add(-1) // it was counted as abandoned
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		// A handler that honours its context returns at once, often with
		// its own verdict (a connector's Unavailable for a broker that
		// did not answer in time): prefer that to the engine's timeout,
		// which spends an attempt.
		grace := time.NewTimer(handlerGrace)
		defer grace.Stop()
		select {
		case err := <-done:
			return err
		case <-grace.C:
		}
		if state.CompareAndSwap(0, 1) {
			d.health.abandoned.Add(1)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("outbox: handler did not return within %v: %w", timeout, ctx.Err())
		}
		return fmt.Errorf("outbox: handler cancelled: %w", ctx.Err())
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
		d.inflight.release(it.key())
	}
}

// offerCold puts a claimed item in the cold queue unless it is in hand
// here already (the claim could take it only if its lease had run out
// while renewals failed, and it is still this instance's to finish) or
// the queue is full.
func (d *dispatcher) offerCold(it *item) offerResult {
	if !d.inflight.acquire(it.key()) {
		return offerInHand
	}
	select {
	case d.cold <- it:
		return offerQueued
	default:
		d.inflight.release(it.key())
		return offerFull
	}
}

// handBack empties the queues and releases the leases of what was in them.
func (d *dispatcher) handBack() {
	var ids []string
	var keys []driver.DeliveryKey
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
		if it.sub == nil {
			ids = append(ids, it.env.ID)
		} else {
			keys = append(keys, driver.DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
		}
	}
	if len(items) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	d.leases.releaseLeases(ctx, ids, "release leases on close")
	d.leases.releaseDeliveries(ctx, keys, 0, "release deliveries on close")
	for _, it := range items {
		d.inflight.release(it.key())
	}
	d.log.Info("handed queued events back to the database", slog.Int("events", len(items)))
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
	it := &item{env: env, path: PathHot, since: time.Now()}
	if age := it.since.Sub(written); age > d.cfg.Lease/2 {
		// Not released early either: this instance's poller may already
		// have claimed the row, and a release would take it back from
		// under that delivery. A poller takes it when the lease ends.
		d.m.HotDropped()
		d.log.Warn("transaction committed late: its lease may have run out; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)),
			slog.Duration("since_written", age), slog.Duration("lease", d.cfg.Lease))
		return
	}
	if !d.inflight.acquire(env.ID) {
		return
	}
	select {
	case d.hot <- it:
		d.m.HotEnqueued()
	default:
		d.inflight.release(env.ID)
		// The row is leased to this instance from its insert, freshly:
		// no poller can have claimed it. Ask the poller to release it so
		// that it is due at once; if even that list is full, the lease
		// runs out by itself.
		select {
		case d.poller.dropped <- env.ID:
		default:
			d.log.Warn("overflow list full too: event waits for its lease to expire",
				slog.String("event_id", env.ID), slog.Duration("lease", d.cfg.Lease))
		}
		d.m.HotDropped()
		d.log.Warn("hot queue full; event left to the poller",
			slog.String("event_id", env.ID), slog.String("event_type", string(env.Type)), slog.Int("capacity", cap(d.hot)))
		d.poller.wake()
	}
}

// handBackLate releases the lease of an event committed after Close
// began, unless this instance still has it in hand.
func (d *dispatcher) handBackLate(id string) {
	if d.inflight.has(id) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	d.leases.releaseLeases(ctx, []string{id}, "release an event committed after close")
	d.log.Debug("outbox closed; event committed after close handed back to the table", slog.String("event_id", id))
}
