package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// PanicError is the error of a handler that panicked.
type PanicError struct {
	Value any
	Stack []byte // as debug.Stack returned it, at the recover

	logged atomic.Bool // by the dispatcher, once
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

// errLeaseLost is returned by callOne and callTx when the lease of the
// item (key in the in-flight set) may have run out: while the call
// waited for a slot of the subscription's Concurrency (the handler is not
// called), or during the call (leaseBound cancelled it). Another instance
// may be delivering it.
var errLeaseLost = errors.New("outbox: the lease may have run out before the call: not delivered here")

// acquire takes a slot of s's Concurrency for the call of the item key,
// and reports errLeaseLost if the item's lease may have run out by then.
// The caller releases the slot (<-s.sem) unless it returns an error.
func (d *dispatcher) acquire(ctx context.Context, key string, s *subscription) error {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if d.leases.expired(key, time.Now()) {
		<-s.sem
		return errLeaseLost
	}
	return nil
}

// callHeld calls s, a Handler or Tx subscription, with ev, and adds its
// result to it. The caller holds a slot of s's Concurrency.
func (d *dispatcher) callHeld(ctx context.Context, it *item, s *subscription, ev Event, probe bool) {
	start := time.Now()
	var err error
	if s.Tx != nil {
		err = d.callTx(ctx, it, s, ev)
	} else {
		err = d.callOne(ctx, it.key(), s, ev)
	}
	r := d.outcome(ctx, s, it, probe, err, time.Since(start))
	r.recorded = s.Tx != nil && err == nil
	it.add(r)
}

// callOne runs a Handler; the caller holds a slot of s's Concurrency.
func (d *dispatcher) callOne(ctx context.Context, key string, s *subscription, ev Event) error {
	f := func(ctx context.Context) error { return s.Handler(ctx, ev) }
	if len(d.cfg.Interceptors) > 0 {
		f = d.interceptDeliver(s.Name, []Event{ev}, f)
	}
	ctx, end := d.leaseBound(ctx, s.Timeout, key)
	defer end()
	return leaseLostOr(ctx, d.call(ctx, s.Timeout, f))
}

// leaseMargin is how long before its lease may run out a call's context
// is cancelled (leaseBound): the handler's grace to return.
const leaseMargin = handlerGrace

// leaseBound returns ctx cancelled, with errLeaseLost as its cause, once
// the lease of one of keys may run out within leaseMargin: no renewal
// has succeeded for a whole lease (the database unreachable, the
// instance frozen), and another instance may take the event over. A call
// so never runs beside another instance's call of the same event, if its
// handler honours its context. While renewals succeed, the bound moves
// with them. end stops it.
//
// A call whose timeout (call's; negative: none) ends before that bound
// needs none: its context is cancelled first in any case.
func (d *dispatcher) leaseBound(ctx context.Context, timeout time.Duration, keys ...string) (_ context.Context, end func()) {
	wait, bounded := d.leaseLeft(keys)
	if !bounded || (timeout >= 0 && wait > timeout) {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	lost := func() {
		for _, k := range keys {
			d.leases.lost(k) // process gives it back (leaseLost)
		}
		cancel(errLeaseLost)
	}
	if wait <= 0 {
		lost()
		return ctx, func() { cancel(nil) }
	}
	var mu sync.Mutex
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(wait, func() {
		if wait, bounded := d.leaseLeft(keys); bounded && wait > 0 {
			mu.Lock()
			t.Reset(wait) // renewed meanwhile
			mu.Unlock()
			return
		}
		lost()
	})
	mu.Unlock()
	return ctx, func() {
		mu.Lock()
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// leaseLeft returns how long until the first lease of keys may run out,
// less leaseMargin, and false if none of them has a known end.
func (d *dispatcher) leaseLeft(keys []string) (time.Duration, bool) {
	var first time.Time
	for _, k := range keys {
		u, ok := d.leases.until(k)
		if ok && u.IsZero() {
			return -1, true // not held here any more
		}
		if ok && (first.IsZero() || u.Before(first)) {
			first = u
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return time.Until(first) - leaseMargin, true
}

// leaseLostOr returns errLeaseLost for a call whose context leaseBound
// cancelled, else err.
func leaseLostOr(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), errLeaseLost) {
		return errLeaseLost
	}
	return err
}

// callTx runs a Tx handler in a transaction that records its delivery,
// in the item's turn with it (driver.TxTurn): a call whose turn ended
// meanwhile (it outlived its lease or its timeout, and its outcome was
// written) records nothing, and its lease is taken as lost.
// The caller holds a slot of s's Concurrency.
func (d *dispatcher) callTx(ctx context.Context, it *item, s *subscription, ev Event) error {
	key := it.key()
	ts := d.store.(driver.TxDeliveryStore) // checked by Subscribe
	turn := driver.TxTurn{Whole: it.sub == nil, Attempts: it.attempts}
	f := func(ctx context.Context) error {
		already, err := ts.DeliverInTx(ctx, d.cfg.InstanceID, turn, ev.ID, s.Name, func(tx DBTx) error {
			return safeCall(ctx, func(ctx context.Context) error { return s.Tx(ctx, tx, ev) })
		})
		if already {
			d.log.Debug("delivery recorded already; not run again", slog.String("event_id", ev.ID), slog.String("subscription", s.Name))
		}
		if errors.Is(err, driver.ErrLeaseLost) {
			d.leases.lost(key) // process gives it back (leaseLost)
			return errLeaseLost
		}
		return err
	}
	if len(d.cfg.Interceptors) > 0 {
		f = d.interceptDeliver(s.Name, []Event{ev}, f)
	}
	ctx, end := d.leaseBound(ctx, s.Timeout, key)
	defer end()
	return leaseLostOr(ctx, d.call(ctx, s.Timeout, f))
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

// maxStackBytes bounds the stack of a handler panic in the log.
const maxStackBytes = 4 << 10

// panicStack returns the stack of a handler panic for the log: from the
// panic site on (debug.Stack's own frames, the recover's and the
// runtime's panic frame cut), at most maxStackBytes, cut at a line. A
// stack shows functions, files and argument words, never the data they
// point to, so no payload reaches the log through it.
func panicStack(stack []byte) string {
	s := string(stack)
	if i := strings.Index(s, "\npanic("); i >= 0 {
		s = s[i+1:]
		// Drop the panic( line and its file:line line.
		for range 2 {
			if j := strings.IndexByte(s, '\n'); j >= 0 {
				s = s[j+1:]
			}
		}
	}
	s = strings.TrimRight(s, "\n")
	if len(s) <= maxStackBytes {
		return s
	}
	cut := strings.LastIndexByte(s[:maxStackBytes], '\n')
	if cut < 0 {
		cut = maxStackBytes
	}
	return s[:cut] + fmt.Sprintf("\n… (%d more bytes)", len(s)-cut)
}

// logPanic logs a handler panic once, at ERROR, with its trimmed stack:
// a batch handler's panic is the outcome of every event of the batch,
// and is logged for the first.
func (d *dispatcher) logPanic(s *subscription, it *item, err error) {
	pe, ok := errors.AsType[*PanicError](err)
	if !ok || !pe.logged.CompareAndSwap(false, true) {
		return
	}
	d.log.Error("handler panicked; the delivery counts as failed",
		slog.String("subscription", s.Name), slog.String("event_id", it.env.ID), slog.String("event_type", string(it.env.Type)),
		slog.String("error", errorText(pe.Error())), slog.String("stack", panicStack(pe.Stack)))
}
