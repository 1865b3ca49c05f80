package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// Recorder is a handler that keeps the events delivered to it, for
// assertions: subscribe it with Record (or ob.Handle(name, rec.Handle)),
// publish, Drain, then look at Events. It is safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	events  []outbox.Event
	changed chan struct{}
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

// Record subscribes a new Recorder to ob under name, for the given event
// types (none: every type), and returns it. Like ob.Handle, it panics on
// an invalid or repeated name or after Start.
func Record(ob *outbox.Outbox, name string, types ...outbox.EventType) *Recorder {
	rec := NewRecorder()
	ob.Handle(name, rec.Handle, types...)
	return rec
}

// Handle is an outbox.Handler: it records ev and succeeds.
func (r *Recorder) Handle(ctx context.Context, ev outbox.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	close(r.changed)
	r.changed = make(chan struct{})
	return nil
}

// Events returns the events delivered so far, in delivery order (a
// redelivered event appears again).
func (r *Recorder) Events() []outbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Len returns the number of deliveries so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// IDs returns the ids of the events delivered so far, in delivery order.
func (r *Recorder) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, len(r.events))
	for i, ev := range r.events {
		ids[i] = ev.ID
	}
	return ids
}

// Types returns the types of the events delivered so far, in delivery
// order.
func (r *Recorder) Types() []outbox.EventType {
	r.mu.Lock()
	defer r.mu.Unlock()
	ts := make([]outbox.EventType, len(r.events))
	for i, ev := range r.events {
		ts[i] = ev.Type
	}
	return ts
}

// Reset forgets the events recorded so far.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = nil
}

// WaitFor blocks until at least n deliveries are recorded and returns
// them, or returns ctx's error with those recorded so far.
func (r *Recorder) WaitFor(ctx context.Context, n int) ([]outbox.Event, error) {
	for {
		r.mu.Lock()
		if len(r.events) >= n {
			evs := slices.Clone(r.events)
			r.mu.Unlock()
			return evs, nil
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			evs := r.Events()
			return evs, fmt.Errorf("outboxtest: %d of %d events delivered: %w", len(evs), n, ctx.Err())
		}
	}
}

// ErrInjected is the error a FailingHandler returns for FailNext without
// an error of its own.
var ErrInjected = errors.New("outboxtest: injected failure")

// ErrDown is the error, marked with outbox.Unavailable, that a
// FailingHandler returns while it is unavailable.
var ErrDown = errors.New("outboxtest: destination down")

// FailingHandler wraps a handler to fail it on demand: the next n calls
// (FailNext), or every call while the destination is down (Unavailable),
// without calling the wrapped handler. It is safe for concurrent use.
type FailingHandler struct {
	h outbox.Handler

	mu         sync.Mutex
	failNext   int
	err        error
	down       bool
	retryAfter time.Duration
	calls      int
	failed     int
}

// Failing returns h wrapped to fail on demand; a nil h succeeds.
func Failing(h outbox.Handler) *FailingHandler { return &FailingHandler{h: h} }

// FailNext makes the next n calls return err (ErrInjected if nil): an
// attempt that counts, unless err is marked with outbox.Unavailable.
func (f *FailingHandler) FailNext(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext, f.err = n, cmpErr(err, ErrInjected)
}

func cmpErr(err, def error) error {
	if err == nil {
		return def
	}
	return err
}

// Unavailable takes the destination down (on) or brings it back: while it
// is down every call returns outbox.Unavailable(ErrDown, 0), which spends
// no attempt and opens the subscription's circuit.
func (f *FailingHandler) Unavailable(on bool) { f.UnavailableRetryAfter(on, 0) }

// UnavailableRetryAfter is Unavailable with the retry-after the
// destination gives (an HTTP Retry-After).
func (f *FailingHandler) UnavailableRetryAfter(on bool, retryAfter time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down, f.retryAfter = on, retryAfter
}

// Calls returns the number of calls so far, failed ones included.
func (f *FailingHandler) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Failures returns the number of calls failed on demand so far.
func (f *FailingHandler) Failures() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// Handle is the wrapped outbox.Handler.
func (f *FailingHandler) Handle(ctx context.Context, ev outbox.Event) error {
	f.mu.Lock()
	f.calls++
	switch {
	case f.down:
		f.failed++
		err := outbox.Unavailable(ErrDown, f.retryAfter)
		f.mu.Unlock()
		return err
	case f.failNext > 0:
		f.failNext--
		f.failed++
		err := f.err
		f.mu.Unlock()
		return err
	}
	f.mu.Unlock()
	if f.h == nil {
		return nil
	}
	return f.h(ctx, ev)
}
