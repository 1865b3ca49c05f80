package outbox

import (
	"errors"
	"sync"
	"time"
)

// unavailableError marks a destination outage.
type unavailableError struct {
	err        error
	retryAfter time.Duration
}

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as an outage of the destination rather than a
// problem of the event: the attempt is not counted, the event is tried
// again later, and after CircuitThreshold such failures in a row the
// subscription's circuit opens (see Subscription). An event refused
// right after the destination took others, more than 4 × CircuitThreshold
// times, is taken for the problem: from then on its refusals count as
// attempts, and it goes DEAD after its max attempts (as remembered by
// this instance: another instance starts its count again). retryAfter, if
// positive, is when the destination said to come back (an HTTP 429 or 503
// Retry-After); otherwise the circuit's own probe interval applies.
func Unavailable(err error, retryAfter time.Duration) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err, retryAfter: retryAfter}
}

// IsUnavailable reports whether err was marked with Unavailable, and the
// retry-after it carries.
func IsUnavailable(err error) (bool, time.Duration) {
	var u *unavailableError
	if errors.As(err, &u) {
		return true, u.retryAfter
	}
	return false, 0
}

// CircuitState is the state of a subscription's circuit on one instance.
type CircuitState string

const (
	CircuitClosed   CircuitState = "closed"    // delivering
	CircuitOpen     CircuitState = "open"      // waiting for the next probe
	CircuitHalfOpen CircuitState = "half-open" // one probe event in flight
)

// circuit is a subscription's breaker on this instance.
type circuit struct {
	cfg *Subscription

	mu        sync.Mutex
	failures  int // consecutive Unavailable failures
	open      bool
	probing   bool // a probe is in flight
	until     time.Time
	nextProbe time.Duration // wait after the next failed probe

	// An event the destination refuses as unavailable while it takes
	// others is the event's problem, not an outage: lastSuccess is the
	// last delivery the destination took, refused the events it refused
	// lately (at most maxRefused, then forgotten).
	lastSuccess time.Time
	refused     map[string]refusal
}

// refusal is what a circuit remembers of an event the destination
// refused: when it last did, and how many of its refusals came right
// after the destination took another event (strikes).
type refusal struct {
	at      time.Time
	strikes int
}

// strikesPerThreshold × CircuitThreshold strikes (20 by default) make an
// event the problem. A destination refusing a share p of calls at random
// strikes an event with a chance of about p(1-p) per try, and lets it
// through with 1-p: with p = 0.6, five strikes before delivery happen to
// one event in ~7,000 (TestAnUnsteadyDestinationKillsNoEvent saw one in
// 858 die, with MaxAttempts 3), twenty to one in ~10^9.
const strikesPerThreshold = 4

// maxRefused bounds a circuit's memory of refused events; past it, the
// memory starts again (an event forgotten spends one more refusal
// without an attempt).
const maxRefused = 4096

// acquire reports whether an event may go to the destination now. While
// the circuit is open, only one probe at a time may, once the wait is
// over; probe is then true and the caller must report the outcome. wait
// is how long to defer the event otherwise.
func (c *circuit) acquire(now time.Time) (ok, probe bool, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.open {
		return true, false, 0
	}
	if c.probing || now.Before(c.until) {
		return false, false, max(c.until.Sub(now), c.cfg.CircuitProbe)
	}
	c.probing = true
	return true, true, 0
}

type claimKind int8

const (
	claimNone  claimKind = iota // open, no probe due
	claimAll                    // closed
	claimProbe                  // open, a probe is due: one delivery
)

// claim says what the poller should claim for this subscription.
func (c *circuit) claim() claimKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.open:
		return claimAll
	case !c.probing && !time.Now().Before(c.until):
		return claimProbe
	}
	return claimNone
}

// success records that the destination took event id, and closes the
// circuit.
func (c *circuit) success(id string, now time.Time) (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen = c.open
	c.failures, c.open, c.probing, c.nextProbe = 0, false, false, 0
	c.lastSuccess = now
	delete(c.refused, id)
	return wasOpen
}

// forget drops event id from the refused events: it is settled.
func (c *circuit) forget(id string) {
	c.mu.Lock()
	delete(c.refused, id)
	c.mu.Unlock()
}

// failure records an attempt that failed for a reason other than an
// outage: the destination answered, so it counts as up. It reports
// whether that closed the circuit.
func (c *circuit) failure(probe bool) (closed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answered(probe)
}

// answered records that the destination is up; c.mu is held.
func (c *circuit) answered(probe bool) (closed bool) {
	c.failures = 0
	closed = c.open
	if probe || c.open {
		c.open, c.probing, c.nextProbe = false, false, 0
	}
	return closed
}

// unavailable records that the destination refused event id as
// unavailable. A refusal that comes right after the destination took
// another event (it took one since it last refused this event, and
// refused nothing since) is a strike against the event; past
// strikesPerThreshold × CircuitThreshold strikes the destination is taken
// to be up and the
// event to be the problem: counted is true, the caller spends an attempt,
// the circuit counts it as an answered failure, and opened reports
// whether that closed the circuit. A destination that is down, or
// overloaded and refusing at random, refuses the others too, and rarely
// strikes one event that often. Otherwise it is an outage: wait is how
// long to defer the event and opened whether the circuit just opened. A
// failed probe is deferred a probe interval past the next probe, so that
// another event, if any is due, probes next: an event the destination
// refuses cannot keep the circuit open on its own while others wait.
func (c *circuit) unavailable(id string, now time.Time, retryAfter time.Duration, probe bool) (wait time.Duration, opened, counted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, seen := c.refused[id]
	if c.refused == nil || len(c.refused) >= maxRefused {
		c.refused = map[string]refusal{}
	}
	if seen && c.lastSuccess.After(r.at) && c.failures == 0 {
		r.strikes++
	}
	r.at = now
	c.refused[id] = r
	if r.strikes > strikesPerThreshold*c.cfg.CircuitThreshold {
		return 0, c.answered(probe), true
	}
	c.failures++
	if probe {
		c.probing = false
		defer func() { wait += c.cfg.CircuitProbe }()
	}
	if !c.open && c.failures < c.cfg.CircuitThreshold {
		return max(retryAfter, c.cfg.CircuitProbe), false, false
	}
	if !c.open {
		opened = true
		c.open = true
		c.nextProbe = c.cfg.CircuitProbe
	} else if probe {
		c.nextProbe = min(2*c.nextProbe, c.cfg.CircuitMaxProbe)
	}
	wait = c.nextProbe
	if retryAfter > 0 {
		wait = retryAfter
	}
	if t := now.Add(wait); t.After(c.until) {
		c.until = t
	}
	return c.until.Sub(now), opened, false
}

// release gives up a probe that was not sent (the event went elsewhere).
func (c *circuit) release(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	c.probing = false
	c.mu.Unlock()
}

// state returns the circuit's state for metrics and tools.
func (c *circuit) state() CircuitState {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.open:
		return CircuitClosed
	case c.probing:
		return CircuitHalfOpen
	}
	return CircuitOpen
}
