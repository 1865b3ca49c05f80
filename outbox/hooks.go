package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Failure is one failed attempt of a subscription's delivery, as a
// failure hook receives it (Subscription.OnRetry, Subscription.OnDead),
// once the write that recorded it has committed.
type Failure struct {
	// Event is the event as the handler got it: Attempt is the attempt
	// that failed, Subscription the subscription's name.
	Event Event
	// Err is what the handler returned (a *PanicError if it panicked, an
	// error wrapping context.DeadlineExceeded if it ran out of Timeout).
	Err error
	// RetryIn is the wait before the next attempt (OnRetry); zero for
	// OnDead.
	RetryIn time.Duration
}

// FailureHook is called with a failure recorded (Subscription.OnRetry,
// Subscription.OnDead). ctx ends after the subscription's Timeout, or at
// Close.
type FailureHook func(ctx context.Context, f Failure)

// hookQueueSize bounds the hook calls waiting per subscription; a call
// that finds it full is dropped, so that a slow hook never holds up
// delivery.
const hookQueueSize = 1024

// hooks runs the subscriptions' failure hooks. It is fed by the
// dispatcher once a failure's write has returned, and owns one goroutine
// per subscription that has a hook (started at its first call), each
// calling that subscription's hooks one at a time from a bounded queue.
type hooks struct {
	log *slog.Logger
	m   Metrics

	// ctx is the calls' context: cancelled by stop once Close's context
	// ends (the calls still queued are then dropped).
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // guards queues and stopped
	queues  map[string]chan hookCall
	stopped bool
	wg      sync.WaitGroup
}

type hookCall struct {
	hook    FailureHook
	f       Failure
	timeout time.Duration
}

func newHooks(log *slog.Logger, m Metrics) *hooks {
	ctx, cancel := context.WithCancel(context.Background())
	return &hooks{log: log, m: m, ctx: ctx, cancel: cancel, queues: map[string]chan hookCall{}}
}

// failed queues the hook of s for the failure r of it, whose write has
// committed: OnRetry for a retry, OnDead for the last attempt.
func (h *hooks) failed(s *subscription, it *item, r result) {
	hook := s.OnRetry
	f := Failure{Event: Event{Envelope: it.env, Attempt: r.attempts, Path: it.path, Subscription: s.Name}, Err: r.cause, RetryIn: r.delay}
	if r.kind == resDead {
		hook, f.RetryIn = s.OnDead, 0
	}
	if hook == nil {
		return
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultListenerTimeout
	}
	h.send(hookCall{hook: hook, f: f, timeout: timeout})
}

func (h *hooks) send(c hookCall) {
	sub := c.f.Event.Subscription
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		h.dropped(sub, 1, "the outbox is closed")
		return
	}
	q := h.queues[sub]
	if q == nil {
		q = make(chan hookCall, hookQueueSize)
		h.queues[sub] = q
		h.wg.Go(func() { h.run(q) })
	}
	select {
	case q <- c:
	default:
		h.dropped(sub, 1, "its queue is full: the hook is slower than the failures come")
	}
}

func (h *hooks) dropped(sub string, n int, why string) {
	for range n {
		h.m.HookDropped(sub)
	}
	h.log.Warn("failure hook not called: "+why+" (Outbox.Dead lists the dead deliveries)", slog.String("subscription", sub), slog.Int("calls", n))
}

// run calls the hooks queued on q until stop closes it; once the calls'
// context ends, the rest are dropped.
func (h *hooks) run(q <-chan hookCall) {
	skipped := 0
	var sub string
	for c := range q {
		if h.ctx.Err() != nil {
			skipped++
			sub = c.f.Event.Subscription
			continue
		}
		h.call(c)
	}
	if skipped > 0 {
		h.dropped(sub, skipped, "Close's context ended first")
	}
}

func (h *hooks) call(c hookCall) {
	ctx, cancel := context.WithTimeout(h.ctx, c.timeout)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			h.log.Error("failure hook panicked", slog.String("subscription", c.f.Event.Subscription), slog.String("event_id", c.f.Event.ID), slog.Any("panic", v))
		}
	}()
	c.hook(ctx, c.f)
}

// stop lets the queued calls run until ctx ends, then cancels the calls'
// context and drops the rest, and waits for the goroutines until until
// ends. It reports whether they all returned (a hook that ignores its
// context may not).
func (h *hooks) stop(ctx, until context.Context) bool {
	h.mu.Lock()
	if !h.stopped {
		h.stopped = true
		for _, q := range h.queues {
			close(q)
		}
	}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		h.cancel()
		return true
	case <-ctx.Done():
	}
	h.cancel()
	return waitUntil(done, until)
}
