package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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
	// leased is the local time just before its lease was taken (the
	// insert, the claim): see inflightSet.
	leased time.Time
	sub    *subscription
	// behind are the ordered subscriptions that owe an earlier event of
	// its key (driver.Row.Behind): deferred, not delivered.
	behind []string
	// handedOn: delivered, and the next event of its key, which waited
	// here behind it, is on its way (keyTable).
	handedOn bool
	// keyPassed: deferred only for the subscriptions behind on its key,
	// and its key passed on (handedOn) or its chain ended before its
	// Split was written (process): failedKeyOn does not again.
	keyPassed bool
	// registry is the version of the registry snapshot by which process
	// decided the subscriptions the event owes (registry.version): the
	// write that completes it (MarkDone, MarkDoneKeys, Split) carries it.
	registry int64
	// owed are the subscriptions of other instances the event owes by
	// that snapshot (registry.owedElsewhere).
	owed []string

	// The join of the subscriptions' outcomes.
	mu      sync.Mutex
	pending int
	results []result
	start   time.Time
	settled time.Time // when the last outcome came in: the delays of the outcomes count from then
}

// key is the item's name in the in-flight set.
func (it *item) key() string {
	if it.sub == nil {
		return it.env.ID
	}
	return deliveryKeyString(it.env.ID, it.sub.Name)
}

func deliveryKeyString(id, sub string) string { return id + "\x00" + sub }

func parseDeliveryID(k string) (driver.DeliveryID, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return driver.DeliveryID{EventID: k[:i], Subscription: k[i+1:]}, true
		}
	}
	return driver.DeliveryID{}, false
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
	behind   bool // deferred behind an earlier event of its key: no wake-up
	delay    time.Duration
	attempts int
	err      string
	cause    error // what the handler returned (a failure hook gets it)
}

func (it *item) add(r result) {
	it.mu.Lock()
	it.results = append(it.results, r)
	it.mu.Unlock()
}

// process delivers one item to its subscriptions and, once every outcome
// is in (batch subscriptions report later), records them.
func (d *dispatcher) process(ctx context.Context, it *item) {
	it.start = time.Now()
	if d.leases.expired(it.key(), it.start) {
		d.leaseLost(it)
		return
	}
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
		owed = reg.owedElsewhere(it.env.Type)
		if len(targets) == 0 && len(owed) == 0 {
			// No subscription anywhere takes it: complete at once, fenced
			// like any completion (a subscription registered since the
			// registry was read refuses the write, and the event is
			// delivered again).
			d.reg.unowned(it.env.ID, it.env.Type)
		} else if len(targets) == 0 {
			// Never complete what no subscription here accepted: give it
			// back for an instance that has one (no attempt spent).
			d.reg.noListener(it.env.ID, it.env.Type)
			ctx, cancel := d.storeCtx()
			d.leases.release(ctx, []string{it.env.ID}, d.cfg.NoListenerDelay, "hand back an event with no subscription here")
			d.chainFailed(ctx, it)
			d.releaseHeld(ctx, it)
			cancel()
			return
		}
		it.registry, it.owed = reg.version, owed
	}
	ev := Event{Envelope: it.env, Attempt: it.attempts + 1, Path: it.path}
	it.pending = 1 // this call's own share, settled at the end
	it.results = make([]result, 0, len(targets)+len(owed))
	for _, s := range targets {
		if slices.Contains(it.behind, s.Name) {
			// Its turn comes when it delivered the earlier events of the
			// key: a NEW delivery, claimed then (ClaimDeliveries).
			it.add(result{sub: s.Name, kind: resDefer, attempts: it.attempts, behind: true})
			continue
		}
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
		if s.gate != nil {
			ev.Subscription = s.Name
			d.gated(s, task{it: it, ev: ev, probe: probe})
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
		if err := d.acquire(ctx, it.key(), s); err != nil {
			it.add(d.outcome(ctx, s, it, probe, err, 0))
			continue
		}
		d.callHeld(ctx, it, s, ev, probe)
		<-s.sem
	}
	for _, name := range owed {
		it.add(result{sub: name, kind: resDefer, attempts: it.attempts})
	}
	d.settle(it)
}

// leaseLost gives up it, which this instance took but whose lease may
// have run out before it came to be delivered: no renewal succeeded for a
// whole lease (the instance paused, or the database was unreachable, for
// that long), so another instance may have claimed it and be delivering
// it. It is not delivered here: its lease is released (a no-op if another
// instance holds it now) and the events waiting behind it here go back
// too.
func (d *dispatcher) leaseLost(it *item) {
	d.log.Warn("lease ran out before delivery (no renewal succeeded for a whole lease): not delivered here, the event is due again",
		slog.String("event_id", it.env.ID), slog.String("event_type", string(it.env.Type)), slog.Duration("lease", d.cfg.Lease))
	ctx, cancel := d.storeCtx()
	defer cancel()
	if it.sub != nil {
		d.leases.releaseDeliveries(ctx, []driver.DeliveryID{{EventID: it.env.ID, Subscription: it.sub.Name}}, 0, "release a delivery whose lease ran out")
	} else {
		d.leases.releaseLeases(ctx, []string{it.env.ID}, "release an event whose lease ran out")
	}
	d.chainFailed(ctx, it)
	d.releaseHeld(ctx, it)
}

// releaseHeld takes it out of the in-flight set after the write that
// ended this instance's turn with it, and gives back the lease a claim
// took of it meanwhile (inflightSet): a no-op if that write freed the row
// after the claim, the row due again at once if the claim came after.
func (d *dispatcher) releaseHeld(ctx context.Context, it *item) {
	if !d.leases.take(it.key()) {
		return
	}
	if it.sub != nil {
		d.leases.releaseDeliveries(ctx, []driver.DeliveryID{{EventID: it.env.ID, Subscription: it.sub.Name}}, 0, "release a delivery claimed again while its outcome was written")
	} else {
		d.leases.releaseLeases(ctx, []string{it.env.ID}, "release an event claimed again while its outcome was written")
	}
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
		if s.circuit.success(it.env.ID, now) {
			d.circuitClosed(s)
		}
		return r // resDone
	}
	d.logPanic(s, it, err)
	if ctx.Err() != nil || errors.Is(err, errLeaseLost) {
		// Shutdown cancelled the call, or the lease may have run out
		// before it (the item comes back to process, which gives it
		// back): not the event's fault.
		s.circuit.release(probe)
		r.kind = resCancelled
		return r
	}
	if down, retryAfter := IsUnavailable(err); down {
		wait, opened, counted := s.circuit.unavailable(it.env.ID, now, retryAfter, probe)
		switch {
		case counted && opened: // here: closed, the destination being up
			d.circuitClosed(s)
		case !counted:
			if opened {
				d.m.Circuit(s.Name, CircuitOpen)
				d.log.Warn("destination unavailable: circuit open, events wait without spending attempts",
					slog.String("subscription", s.Name), slog.Duration("probe_in", wait), slog.String("error", errorText(err.Error())))
			}
			r.kind, r.delay, r.err = resDefer, wait, errorText(err.Error())
			return r
		}
		d.log.Warn("destination refuses this event as unavailable while it takes others: the attempt counts",
			slog.String("subscription", s.Name), slog.String("event_id", it.env.ID), slog.String("error", errorText(err.Error())))
	} else if s.circuit.failure(probe) {
		d.circuitClosed(s)
	}
	r.attempts = it.attempts + 1
	r.err, r.cause = errorText(err.Error()), err
	if s.Classify(err) == DecisionDead || r.attempts >= s.MaxAttempts {
		r.kind = resDead
		s.circuit.forget(it.env.ID)
	} else {
		r.kind, r.delay = resRetry, s.Retry.Delay(r.attempts)
	}
	return r
}

// circuitClosed reports that s's circuit closed (the destination took an
// event, or answered about one) and makes what waited for it due now,
// not at its probe time.
func (d *dispatcher) circuitClosed(s *subscription) {
	// Reported first: what is due now starts at once.
	d.m.Circuit(s.Name, CircuitClosed)
	dctx, cancel := d.storeCtx()
	n, err := d.dstore.DueNow(dctx, s.Name)
	cancel()
	if err != nil {
		d.log.Error("make the deliveries deferred by the circuit due", slog.String("subscription", s.Name), slog.Any("error", err))
	}
	d.sig.wakePoll()
	d.log.Info("deliveries deferred while the destination was down are due", slog.String("subscription", s.Name), slog.Int("deliveries", n))
	d.log.Info("destination back: circuit closed", slog.String("subscription", s.Name))
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
		ctx, cancel := d.storeCtx()
		d.chainFailed(ctx, it)
		cancel()
		return
	}
	if done {
		d.m.Dispatched(it.env.Type, it.path, OutcomeDone, took)
		if len(it.behind) == 0 {
			it.handedOn = d.chainDelivered(it)
		} else {
			// Delivered to every subscription here that takes it, but
			// some subscription still owes an earlier event of the key:
			// the next event goes on only if it is known to owe it too
			// (a run claimed behind it); else the events behind it go
			// back to the table, where the claim says who is behind for
			// them.
			ctx, cancel := d.storeCtx()
			it.handedOn = d.chainDeliveredBehind(ctx, it)
			cancel()
		}
		if it.sub != nil && it.results[0].recorded {
			// A Tx subscription's delivery: recorded in its own
			// transaction already.
			d.leases.letGo(it.key())
			d.sig.next(it)
			return
		}
		d.comp.add(it) // the completer releases it after the write
		return
	}
	if outcome != OutcomeDone {
		d.m.Dispatched(it.env.Type, it.path, outcome, took)
	}
	if deferredOnly(it) {
		it.settled = time.Now()
		if len(it.behind) > 0 {
			// Deferred for those behind only, as its run expects: the
			// key goes on now, as after a delivery, not after the write.
			ctx, cancel := d.storeCtx()
			it.handedOn, it.keyPassed = d.chainDeliveredBehind(ctx, it), true
			cancel()
		}
		d.comp.add(it) // its Split goes with others' (recordDeferrals)
		return
	}
	d.recordFailures(it)
}

// deferredOnly reports whether it is an event delivered as a whole that
// every subscription here which did not deliver it deferred without an
// attempt: with no chain, for a rate limit's gate or an open circuit;
// claimed behind an earlier event of its key (it.behind), for the
// subscriptions behind only (onlyBehind). Its Split is written with
// others' in one transaction by the completer (recordDeferrals), since
// such deferrals come by the thousand a second: beside a busy stream (a
// limited subscription with a backlog), and along a key's backlog while
// a subscription owes an earlier event of it (a run, deferred event by
// event: one write each took a key to ~600 events/s).
func deferredOnly(it *item) bool {
	if it.sub != nil {
		return false
	}
	if len(it.behind) > 0 {
		return onlyBehind(it)
	}
	if chained(it) {
		return false
	}
	some := false
	for _, r := range it.results {
		switch {
		case r.kind == resDone:
		case r.kind == resDefer && !r.behind:
			some = true
		default:
			return false
		}
	}
	return some
}

// recordDeferrals writes the Splits of its (each deferredOnly), one write
// per registry version they were decided by, and finishes each as
// recordFailures does. If a write fails (or the registry moved), each of
// its events is recorded on its own, as recordFailures would.
func (d *dispatcher) recordDeferrals(its []*item) {
	ctx, cancel := d.storeCtx()
	defer cancel()
	for _, group := range byRegistry(its) {
		splits := make([]driver.EventSplit, len(group))
		wakes := make([]time.Duration, len(group))
		n := 0
		for i, it := range group {
			splits[i].EventID = it.env.ID
			splits[i].Writes, wakes[i] = d.failureWrites(it)
			n += len(splits[i].Writes)
			// Due when each deferral said, not that much after the
			// write: a gate asks for its deferred events back about when
			// it is half empty, and would otherwise run dry while they
			// waited for the completer.
			waited := time.Since(it.settled)
			for j := range splits[i].Writes {
				splits[i].Writes[j].Delay = max(0, splits[i].Writes[j].Delay-waited)
			}
			if wakes[i] > 0 {
				wakes[i] = max(0, wakes[i]-waited)
			}
		}
		start := time.Now()
		held, err := retryStore(ctx, func() ([]bool, error) {
			return d.dstore.Split(ctx, d.cfg.InstanceID, splits, group[0].registry)
		})
		d.m.Statement("split", n, time.Since(start))
		if err == nil && len(held) != len(splits) {
			err = fmt.Errorf("outbox: the store's Split reported %d results for %d events", len(held), len(splits))
		}
		for i, it := range group {
			if err != nil {
				h, ferr := d.writeFailures(ctx, it, splits[i].Writes)
				d.failuresWritten(ctx, it, h, ferr, wakes[i])
				continue
			}
			d.failuresWritten(ctx, it, held[i], nil, wakes[i])
		}
	}
}

// splitFenced makes write, and if the store refused it for a stale
// registry, makes it again with the new version, with the deliveries the
// event owes elsewhere under the new registry (rewrites).
// It returns the writes it made last.
func (d *dispatcher) splitFenced(ctx context.Context, it *item, writes []driver.DeliveryWrite, write func([]driver.DeliveryWrite) (bool, error)) (bool, []driver.DeliveryWrite, error) {
	held, err := write(writes)
	if !fenced(err) || it.sub != nil {
		return held, writes, err
	}
	v := it.registry
	if serr := d.reg.syncIfOlder(ctx, v); serr != nil {
		return held, writes, err
	}
	if reg := d.reg.load(); reg.version != v {
		writes = rewrites(it, writes, reg) // it.registry is the new version now
		held, err = write(writes)
	}
	return held, writes, err
}

// canDeliver reports whether one of the subscriptions named is here, not
// paused, with its circuit closed.
func (d *dispatcher) canDeliver(names []string) bool {
	reg := d.reg.load()
	for _, n := range names {
		if s := reg.byName[n]; s != nil && !reg.paused[n] && s.circuit.state() == CircuitClosed {
			return true
		}
	}
	return false
}

// onlyBehind reports whether every subscription of it that did not
// deliver it was deferred for owing an earlier event of its key (one of
// it.behind), which is all that a run claimed behind it expects.
func onlyBehind(it *item) bool {
	some := false
	for _, r := range it.results {
		switch {
		case r.kind == resDone:
		case r.kind == resDefer && r.behind:
			some = true
		default:
			return false
		}
	}
	return some
}

// failureWrites returns the delivery writes of the subscriptions that
// did not deliver it, logging each, and the shortest delay of those to be
// retried (-1: none).
func (d *dispatcher) failureWrites(it *item) ([]driver.DeliveryWrite, time.Duration) {
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
		if w.Status != driver.StatusDead && !r.behind && (wake < 0 || r.delay < wake) {
			wake = r.delay
		}
		writes = append(writes, w)
	}
	return writes, wake
}

// recordFailures writes the state of the subscriptions that did not
// deliver the item.
func (d *dispatcher) recordFailures(it *item) {
	ctx, cancel := d.storeCtx()
	defer cancel()
	writes, wake := d.failureWrites(it)
	held, err := d.writeFailures(ctx, it, writes)
	d.failuresWritten(ctx, it, held, err, wake)
}

// failuresWritten finishes it once the write of its failures returned
// (held: under this instance's lease), wake the shortest delay of those
// to be retried (-1: none).
func (d *dispatcher) failuresWritten(ctx context.Context, it *item, held bool, err error, wake time.Duration) {
	if fenced(err) {
		// Split for a stale registry: nothing written. The lease is
		// still this instance's; the event goes back.
		d.registryChanged(ctx, it.registry, []*item{it})
		d.releaseHeld(ctx, it)
		return
	}
	// The item leaves this instance's hands once the write that gives up
	// its lease has returned, before the events behind it in its key are
	// passed on or given back.
	d.releaseHeld(ctx, it)
	switch {
	case err != nil:
		d.log.Error("record failed delivery; the event is delivered again when its lease expires", slog.String("event_id", it.env.ID), slog.Any("error", err))
	case !held:
		d.log.Warn("lease lost: another instance owns the event; outcome not recorded", slog.String("event_id", it.env.ID))
	}
	d.failedKeyOn(ctx, it, held && err == nil)
	// After the events that waited behind it in its key were given back:
	// until then their leases keep a claim off the delivery just written
	// (not its key's turn while a later event of the key is leased), and
	// a poll woken before would find nothing and leave it to the idle
	// back-off.
	if err == nil && held && wake >= 0 {
		d.sig.scheduleRetryWake(time.Now().Add(wake))
	}
	if err == nil && held {
		d.failureHooks(it)
	}
	d.sig.next(it) // the key's next event may go now (a failure here holds it back only if an ordered subscription failed)
}

// failureHooks queues the failure hooks of it's retries and dead
// deliveries, whose write has committed.
func (d *dispatcher) failureHooks(it *item) {
	reg := d.reg.load()
	for _, r := range it.results {
		if r.kind != resRetry && r.kind != resDead {
			continue
		}
		if s := reg.byName[r.sub]; s != nil && (s.OnRetry != nil || s.OnDead != nil) {
			d.hooks.failed(s, it, r)
		}
	}
}

// writeFailures writes the failure writes of it (a Split of an event, or
// one delivery's failure), fenced by the registry; if the database refuses
// the outcome itself (the text, a column, a trigger), it records it again
// with a text it cannot refuse, so that attempts still advance and the
// delivery reaches DEAD rather than being tried again every lease. It
// reports whether the lease was still this instance's.
func (d *dispatcher) writeFailures(ctx context.Context, it *item, writes []driver.DeliveryWrite) (bool, error) {
	write := func(writes []driver.DeliveryWrite) (bool, error) {
		start := time.Now()
		name := "split"
		if it.sub != nil {
			name = "fail_delivery"
		}
		defer func() { d.m.Statement(name, len(writes), time.Since(start)) }()
		return retryStore(ctx, func() (bool, error) {
			if it.sub == nil {
				return splitOne(ctx, d.dstore, d.cfg.InstanceID, it, writes)
			}
			return d.dstore.FailDelivery(ctx, d.cfg.InstanceID, driver.DeliveryID{EventID: it.env.ID, Subscription: it.sub.Name}, writes[0])
		})
	}
	held, writes, err := d.splitFenced(ctx, it, writes, write)
	if err == nil || fenced(err) || ctx.Err() != nil {
		return held, err
	}
	d.log.Error("record failed delivery; recording it without the error text", slog.String("event_id", it.env.ID), slog.Any("error", err))
	for _, text := range []string{errorText("outbox: the handler's error could not be stored: " + err.Error()), "outbox: the handler's error could not be stored"} {
		for i := range writes {
			if writes[i].Error != "" {
				writes[i].Error = text
			}
		}
		if held, err = write(writes); err == nil {
			break
		}
	}
	return held, err
}

// splitOne is DeliveryStore.Split of it alone.
func splitOne(ctx context.Context, ds driver.DeliveryStore, owner string, it *item, writes []driver.DeliveryWrite) (bool, error) {
	held, err := ds.Split(ctx, owner, []driver.EventSplit{{EventID: it.env.ID, Writes: writes}}, it.registry)
	return err == nil && len(held) == 1 && held[0], err
}

// failedKeyOn passes the key of it on, or gives back what waited behind
// it, once its failures were recorded (written: the write succeeded,
// under this instance's lease).
func (d *dispatcher) failedKeyOn(ctx context.Context, it *item, written bool) {
	if !onlyBehind(it) {
		d.chainFailed(ctx, it)
		return
	}
	// Delivered to every subscription here but those behind on its key:
	// the next event goes on if it owes them too (unless it went on
	// before the write: keyPassed).
	if !it.keyPassed {
		it.handedOn = d.chainDeliveredBehind(ctx, it)
	}
	if !it.handedOn && written && d.canDeliver(it.behind) {
		// Those behind may have caught up since the claim said so (their
		// last delivery of the key finished, its poll found nothing yet):
		// the delivery just recorded for them is claimed by a poll now,
		// not after the idle back-off. Once per chain, and not for a
		// subscription that cannot take it now (paused, circuit open).
		d.sig.wakePoll()
	}
}
