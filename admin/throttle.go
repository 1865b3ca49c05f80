package admin

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Failed logins are throttled per client address with a token bucket:
// each try takes a token before Authorize runs, a successful one gives it
// back, and a failed one keeps it; the bucket holds LoginBurst tokens and
// gains one every LoginEvery. An address with no token left is answered
// 429 with Retry-After at once, without calling Authorize (so a guess is
// not even checked) and without waiting in the request: no goroutine is
// held, whatever the client sends.

const (
	defaultLoginBurst = 10
	defaultLoginEvery = 2 * time.Second
	// maxThrottled bounds the addresses tracked: past it, the buckets
	// that have filled up again are dropped, and if none has, all of
	// them (an attacker with that many addresses gets a fresh burst on
	// each, as it would with one bucket per address anyway).
	maxThrottled = 10_000
)

type throttle struct {
	mu    sync.Mutex
	burst float64
	every time.Duration
	now   func() time.Time
	addrs map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
	told   bool // the lockout is in the log
}

func newThrottle(burst int, every time.Duration) *throttle {
	if burst == 0 {
		burst = defaultLoginBurst
	}
	if every <= 0 {
		every = defaultLoginEvery
	}
	if burst < 0 {
		return nil
	}
	return &throttle{burst: float64(burst), every: every, now: time.Now, addrs: map[string]*bucket{}}
}

// refill brings b up to now; the caller holds t.mu.
func (t *throttle) refill(b *bucket, now time.Time) {
	if el := now.Sub(b.at); el > 0 {
		b.tokens = min(t.burst, b.tokens+float64(el)/float64(t.every))
		b.at = now
	}
	if b.tokens >= 1 {
		b.told = false
	}
}

// take takes a token for a try from addr. Without one it returns how long
// until the next, and whether this is the first refusal of the lockout.
func (t *throttle) take(addr string) (wait time.Duration, first bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	b := t.addrs[addr]
	if b == nil {
		if len(t.addrs) >= maxThrottled {
			t.sweep(now)
		}
		b = &bucket{tokens: t.burst, at: now}
		t.addrs[addr] = b
	}
	t.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return 0, false
	}
	first = !b.told
	b.told = true
	return time.Duration((1 - b.tokens) * float64(t.every)), first
}

// refund gives back the token of a successful try.
func (t *throttle) refund(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if b := t.addrs[addr]; b != nil {
		b.tokens = min(t.burst, b.tokens+1)
		if b.tokens >= t.burst {
			delete(t.addrs, addr)
		}
	}
}

// sweep drops the buckets that are full again, or all; the caller holds
// t.mu.
func (t *throttle) sweep(now time.Time) {
	for addr, b := range t.addrs {
		if t.refill(b, now); b.tokens >= t.burst {
			delete(t.addrs, addr)
		}
	}
	if len(t.addrs) >= maxThrottled {
		clear(t.addrs)
	}
}

// remoteHost is the default Config.ClientAddr: the host of RemoteAddr.
func remoteHost(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
