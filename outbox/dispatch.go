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

// process delivers one item to its subscriptions and, once every outcome
// is in (batch subscriptions report later), records them.
func (o *Outbox) process(ctx context.Context, it *item) {
	it.start = time.Now()
	if it.attempts == 0 && it.sub == nil {
		o.m.Latency(it.path, it.start.Sub(it.since))
	}
	reg := o.subs.Load()
	var targets []*subscription
	var owed []string
	if it.sub != nil {
		targets = []*subscription{it.sub}
	} else {
		targets = reg.match(it.env.Type)
		if len(targets) == 0 {
			// Never complete what no subscription here accepted: give it
			// back for an instance that has one (no attempt spent).
			o.noListener(it.env.ID, it.env.Type)
			ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			o.releaseAfter(ctx, []string{it.env.ID}, o.cfg.NoListenerDelay, "hand back an event with no subscription here")
			cancel()
			o.inflight.release(it.key())
			return
		}
		owed = reg.owedElsewhere(it.env.Type)
	}
	ev := Event{Envelope: it.env, Attempt: it.attempts + 1, Path: it.path}
	it.pending = 1 // this call's own share, settled at the end
	it.results = make([]result, 0, len(targets)+len(owed))
	for _, s := range targets {
		if reg.paused[s.Name] {
			o.m.Delivered(s.Name, OutcomeDeferred, 0)
			it.add(result{sub: s.Name, kind: resDefer, attempts: it.attempts})
			continue
		}
		ok, probe, wait := s.circuit.acquire(time.Now())
		if !ok {
			o.m.Delivered(s.Name, OutcomeDeferred, 0)
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
				o.settle(it)
			}
			continue
		}
		ev.Subscription = s.Name
		start := time.Now()
		if s.Tx != nil {
			err := o.callTx(ctx, s, ev)
			r := o.outcome(ctx, s, it, probe, err, time.Since(start))
			r.recorded = err == nil
			it.add(r)
			continue
		}
		err := o.callOne(ctx, s, ev)
		it.add(o.outcome(ctx, s, it, probe, err, time.Since(start)))
	}
	for _, name := range owed {
		it.add(result{sub: name, kind: resDefer, attempts: it.attempts})
	}
	o.settle(it)
}

func (it *item) add(r result) {
	it.mu.Lock()
	it.results = append(it.results, r)
	it.mu.Unlock()
}

// settle counts one share of the item as finished and records the
// outcomes once the last share is in.
func (o *Outbox) settle(it *item) {
	it.mu.Lock()
	it.pending--
	last := it.pending == 0
	it.mu.Unlock()
	if last {
		o.finish(it)
	}
}

// outcome turns a call's error into the subscription's result, updating
// its circuit.
func (o *Outbox) outcome(ctx context.Context, s *subscription, it *item, probe bool, err error, took time.Duration) (r result) {
	r = result{sub: s.Name, attempts: it.attempts}
	defer func() {
		if r.kind != resCancelled {
			o.m.Delivered(s.Name, r.kind.outcome(), took)
		}
	}()
	now := time.Now()
	if err == nil {
		if s.circuit.success() {
			// What waited for the circuit is due now, not at its probe time.
			dctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
			n, err := o.dstore.DueNow(dctx, s.Name)
			cancel()
			if err != nil {
				o.log.Error("make the deliveries deferred by the circuit due", slog.String("subscription", s.Name), slog.Any("error", err))
			}
			o.wakePoller()
			o.m.Circuit(s.Name, CircuitClosed)
			o.log.Info("deliveries deferred while the destination was down are due", slog.String("subscription", s.Name), slog.Int("deliveries", n))
			o.log.Info("destination back: circuit closed", slog.String("subscription", s.Name))
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
			o.m.Circuit(s.Name, CircuitOpen)
			o.log.Warn("destination unavailable: circuit open, events wait without spending attempts",
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
func (o *Outbox) finish(it *item) {
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
		o.requeue(it)
		return
	}
	if done {
		o.m.Dispatched(it.env.Type, it.path, OutcomeDone, took)
		if it.sub != nil && it.results[0].recorded {
			// A Tx subscription's delivery: recorded in its own
			// transaction already.
			o.inflight.release(it.key())
			return
		}
		o.comp.add(it) // the completer releases it after the write
		return
	}
	if outcome != OutcomeDone {
		o.m.Dispatched(it.env.Type, it.path, outcome, took)
	}
	o.recordFailures(it)
}

// recordFailures writes the state of the subscriptions that did not
// deliver the item.
func (o *Outbox) recordFailures(it *item) {
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
			o.log.Warn("delivery failed; will retry", append(attrs, slog.Int("attempt", r.attempts), slog.Duration("retry_in", r.delay), slog.String("error", r.err))...)
		case resDead:
			w.Status = driver.StatusDead
			o.log.Error("delivery is dead: failed for the last time", append(attrs, slog.Int("attempt", r.attempts), slog.String("error", r.err))...)
		case resDefer:
			w.Status = driver.StatusNew
			if r.err != "" {
				o.log.Debug("destination unavailable; delivery deferred without an attempt", append(attrs, slog.Duration("retry_in", r.delay), slog.String("error", r.err))...)
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
	o.inflight.release(it.key())
	write := func(writes []driver.DeliveryWrite) (bool, error) {
		start := time.Now()
		name := "split"
		if it.sub != nil {
			name = "fail_delivery"
		}
		defer func() { o.m.Statement(name, len(writes), time.Since(start)) }()
		return retryStore(ctx, func() (bool, error) {
			if it.sub == nil {
				return o.dstore.Split(ctx, o.cfg.InstanceID, it.env.ID, writes)
			}
			return o.dstore.FailDelivery(ctx, o.cfg.InstanceID, driver.DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name}, writes[0])
		})
	}
	held, err := write(writes)
	if err != nil && ctx.Err() == nil {
		// The database refused the outcome itself (the text, a column, a
		// trigger): record it with a text it cannot refuse, so that
		// attempts still advance and the delivery reaches DEAD rather
		// than being tried again every lease.
		o.log.Error("record failed delivery; recording it without the error text", slog.String("event_id", it.env.ID), slog.Any("error", err))
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
		o.log.Error("record failed delivery; the event is delivered again when its lease expires", slog.String("event_id", it.env.ID), slog.Any("error", err))
	case !held:
		o.log.Warn("lease lost: another instance owns the event; outcome not recorded", slog.String("event_id", it.env.ID))
	case wake >= 0:
		o.scheduleRetryWake(time.Now().Add(wake))
	}
}

// callOne runs a Handler within the subscription's concurrency limit.
func (o *Outbox) callOne(ctx context.Context, s *subscription, ev Event) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	return o.call(ctx, s.Timeout, func(ctx context.Context) error { return s.Handler(ctx, ev) })
}

// callTx runs a Tx handler in a transaction that records its delivery.
func (o *Outbox) callTx(ctx context.Context, s *subscription, ev Event) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.sem }()
	ts := o.store.(driver.TxDeliveryStore) // checked by Subscribe
	return o.call(ctx, s.Timeout, func(ctx context.Context) error {
		already, err := ts.DeliverInTx(ctx, ev.ID, s.Name, func(tx DBTx) error {
			return safeCall(ctx, func(ctx context.Context) error { return s.Tx(ctx, tx, ev) })
		})
		if already {
			o.log.Debug("delivery recorded already; not run again", slog.String("event_id", ev.ID), slog.String("subscription", s.Name))
		}
		return err
	})
}

// call runs a handler with a timeout, containing panics. A handler that
// ignores its cancelled context is abandoned: the caller moves on, and
// Close waits for the abandoned call.
func (o *Outbox) call(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	if timeout < 0 {
		return safeCall(ctx, f)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan error, 1)
	var state atomic.Int32 // 0 running, 1 abandoned, 2 returned in time
	o.stragglers.Add(1)
	o.running.Add(1)
	go func() {
		defer o.stragglers.Done()
		defer o.running.Add(-1) // runs before Done: see Close
		done <- safeCall(ctx, f)
		if !state.CompareAndSwap(0, 2) {
			o.health.abandoned.Add(-1) // it was counted as abandoned
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done:
			return err
		default:
		}
		if state.CompareAndSwap(0, 1) {
			o.health.abandoned.Add(1)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("outbox: handler did not return within %v: %w", timeout, ctx.Err())
		}
		return fmt.Errorf("outbox: handler cancelled: %w", ctx.Err())
	}
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
	o   *Outbox
	s   *subscription
	in  chan task
	wg  sync.WaitGroup
	ctx context.Context
}

func newBatcher(o *Outbox, s *subscription) *batcher {
	return &batcher{o: o, s: s, in: make(chan task, 2*s.BatchSize)}
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
	err := b.o.call(b.ctx, b.s.Timeout, func(ctx context.Context) error { return b.s.Batch(ctx, evs) })
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
		t.it.add(b.o.outcome(b.ctx, b.s, t.it, t.probe, e, took))
		b.o.settle(t.it)
	}
}
