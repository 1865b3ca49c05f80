package outbox

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// gateHold is how much of a limited subscription's rate its gate holds in
// memory (leased, renewed, waiting for a token): a second's worth of
// events, at least Burst, at most maxGateHold. What comes beyond that is
// deferred in the table (gate.add).
const (
	gateHold    = time.Second
	maxGateHold = 10_000
)

// gate paces the calls of one subscription with a Rate: a token bucket on
// this instance, between the dispatcher's workers and the handler. A
// worker hands it the subscription's share of an item (task) and goes on
// to the next item at once; the gate's goroutine takes one token per
// event and then calls the handler (or passes the event to the
// subscription's batcher), within the subscription's Concurrency. So a
// limited subscription never holds a worker while it waits. (Deferring
// an event that went to other subscriptions too is a Split, which the
// completer writes with others' in one transaction: recordDeferrals.)
//
// The gate holds at most a second's worth of events. A task that finds it
// full is deferred in the table (attempts unchanged) until about when the
// gate is half empty, when the gate asks for a poll; the poller claims a
// limited subscription's deliveries only as many as its gate has room
// for (room), so that a backlog waits in the table, not in memory, and is
// not claimed only to be deferred again; and it does so before it claims
// whole events, once the gate is half empty (refillGates), so that a
// drain beside it does not leave the gate dry.
type gate struct {
	d    *dispatcher
	s    *subscription
	in   chan task
	stop chan struct{} // closed by close: postpone what is held, wait for no token

	mu     sync.RWMutex // held for reading by add, for writing by close
	closed bool

	calls sync.WaitGroup // handler calls started by run

	// owed: deliveries of the subscription may wait in the table for
	// room here (the gate postponed a task, or the poller's claim for it
	// was cut at its room). The gate asks for a poll when it is half
	// empty.
	owed atomic.Bool
}

func newGate(d *dispatcher, s *subscription) *gate {
	hold := int(math.Ceil(s.Rate * gateHold.Seconds()))
	hold = min(max(hold, s.Burst, 1), maxGateHold)
	return &gate{d: d, s: s, in: make(chan task, hold), stop: make(chan struct{})}
}

// gateAdd is what became of a task handed to a gate.
type gateAdd int8

const (
	gateQueued gateAdd = iota
	gateFull           // the caller postpones it (wait says for how long)
	gateClosed         // Close stopped the gate: the caller gives it back
)

// gated hands s's share of it to s's gate, or postpones it if the gate is
// full.
func (d *dispatcher) gated(s *subscription, t task) {
	t.it.mu.Lock()
	t.it.pending++
	t.it.mu.Unlock()
	switch s.gate.add(t) {
	case gateFull:
		s.gate.owed.Store(true)
		s.gate.postpone(t, s.gate.wait())
	case gateClosed:
		s.circuit.release(t.probe)
		t.it.add(result{sub: s.Name, kind: resCancelled})
		d.settle(t.it)
	}
}

// add queues t without blocking.
func (g *gate) add(t task) gateAdd {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return gateClosed
	}
	select {
	case g.in <- t:
		return gateQueued
	default:
		return gateFull
	}
}

// wait is about how long until the gate is half empty: the time to let
// through half of what it holds, when it asks for a poll (run).
func (g *gate) wait() time.Duration {
	return time.Duration(float64(len(g.in)) / 2 / g.s.Rate * float64(time.Second))
}

// room is how many tasks the gate can take now: the most deliveries of
// its subscription worth claiming.
func (g *gate) room() int {
	return cap(g.in) - len(g.in)
}

// close ends the input: run defers what it holds and returns once the
// calls it started have returned.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		close(g.stop)
		close(g.in)
	}
}

// run lets the tasks through at the subscription's rate until in is
// closed. Once the gate is stopped, what it still holds is deferred, due
// at once: not delivered, attempts unchanged.
func (g *gate) run(ctx context.Context) {
	b := bucket{rate: g.s.Rate, burst: float64(g.s.Burst), tokens: float64(g.s.Burst), last: time.Now()}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for t := range g.in {
		if len(g.in) <= cap(g.in)/2 && g.owed.CompareAndSwap(true, false) {
			g.d.sig.wakePoll() // claims up to room of what waits in the table
		}
		if !g.token(ctx, &b, timer) {
			g.postpone(t, 0)
			continue
		}
		g.pass(ctx, t)
	}
	g.calls.Wait()
}

// token waits for a token of b; it reports false if the gate was stopped
// or ctx ended first.
func (g *gate) token(ctx context.Context, b *bucket, timer *time.Timer) bool {
	for {
		wait := b.take(time.Now())
		if wait == 0 {
			return true
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-g.stop:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// pass delivers t, which has its token: to the subscription's batcher,
// or to its handler on a goroutine of its own once a slot of the
// subscription's Concurrency is free.
func (g *gate) pass(ctx context.Context, t task) {
	d, s := g.d, g.s
	if s.batch != nil {
		if !s.batch.add(ctx, t) {
			s.circuit.release(t.probe)
			t.it.add(result{sub: s.Name, kind: resCancelled})
			d.settle(t.it)
		}
		return
	}
	key := t.it.key()
	if err := d.acquire(ctx, key, s); err != nil {
		t.it.add(d.outcome(ctx, s, t.it, t.probe, err, 0))
		d.settle(t.it)
		return
	}
	g.calls.Go(func() {
		defer func() { <-s.sem }()
		d.callHeld(ctx, t.it, s, t.ev, t.probe)
		d.settle(t.it)
	})
}

// postpone settles t as deferred by delay, without an attempt.
func (g *gate) postpone(t task, delay time.Duration) {
	g.s.circuit.release(t.probe)
	g.d.m.Delivered(g.s.Name, OutcomeDeferred, 0)
	t.it.add(result{sub: g.s.Name, kind: resDefer, delay: delay, attempts: t.it.attempts})
	g.d.settle(t.it)
}

// bucket is a token bucket: rate tokens a second, at most burst at once.
type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

// take takes a token at now and returns 0, or returns how long until one
// is there.
func (b *bucket) take(now time.Time) time.Duration {
	if now.After(b.last) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration(math.Ceil((1 - b.tokens) / b.rate * float64(time.Second)))
}
