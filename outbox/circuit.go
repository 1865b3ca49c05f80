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
// subscription's circuit opens (see Subscription). retryAfter, if
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
}

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

// success closes the circuit.
func (c *circuit) success() (wasOpen bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasOpen = c.open
	c.failures, c.open, c.probing, c.nextProbe = 0, false, false, 0
	return wasOpen
}

// failure records an attempt that failed for a reason other than an
// outage: the destination answered, so it counts as up.
func (c *circuit) failure(probe bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures = 0
	if probe || c.open {
		c.open, c.probing, c.nextProbe = false, false, 0
	}
}

// unavailable records an outage and returns how long to defer the event
// and whether the circuit just opened.
func (c *circuit) unavailable(now time.Time, retryAfter time.Duration, probe bool) (wait time.Duration, opened bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failures++
	if probe {
		c.probing = false
	}
	if !c.open && c.failures < c.cfg.CircuitThreshold {
		return max(retryAfter, c.cfg.CircuitProbe), false
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
	return c.until.Sub(now), opened
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
