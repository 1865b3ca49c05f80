package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// storeTimeout bounds the engine's own writes (completion, retry, lease
// renewal) so that a hung database cannot hold a worker forever.
const storeTimeout = 15 * time.Second

// Start launches the workers, the completion writer, the lease renewer, the
// sampler and (unless disabled) the poller, and returns at once. The engine
// runs until Close; cancelling ctx stops it without draining, and Close must
// still be called. To drain on shutdown, give Start a context that outlives
// the shutdown signal (context.WithoutCancel(ctx)) and let Close stop the
// engine. Calling Start again does nothing; after Close it returns
// ErrClosed.
func (o *Outbox) Start(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return ErrClosed
	}
	if o.started {
		return nil
	}
	if err := o.syncRegistry(ctx); err != nil {
		return fmt.Errorf("outbox: Start: register the subscriptions: %w", err)
	}
	o.started = true
	o.health.pollBeat.Store(time.Now().UnixNano())
	o.m.QueueCapacities(cap(o.hot), cap(o.cold))
	runCtx, cancel := context.WithCancel(ctx)
	o.cancelRun = cancel
	for _, s := range o.subs.Load().local {
		if s.Batch != nil {
			s.batch = newBatcher(o, s)
			o.batchers.Go(func() { s.batch.run(runCtx) })
		}
	}
	for range o.cfg.Workers {
		o.workers.Go(func() { o.work(runCtx) })
	}
	o.background.Go(func() { o.registryLoop(runCtx) })
	o.comp.start()
	o.background.Go(func() { o.leases.run(runCtx) })
	o.background.Go(func() { o.sample(runCtx) })
	if o.cfg.Retention > 0 {
		o.background.Go(func() { o.cleanupLoop(runCtx) })
	}
	pollCtx, stopPoll := context.WithCancel(runCtx)
	o.stopPoll = stopPoll
	if !o.cfg.DisablePoller {
		o.poller.Go(func() { o.pollLoop(pollCtx) })
	}
	return nil
}

// closeGrace is how long Close waits, after its own context ended, for
// listener calls whose context it cancelled.
const closeGrace = time.Second

// Close stops the engine: it stops the poller, lets the workers deliver
// what is queued until ctx is done, then cancels the listeners still
// running, hands the rest back to the database (releasing their leases so
// any instance can take them at once), writes the last completions, and
// waits for every goroutine it started. Events published after Close stay
// in the table for the poller of another or the next instance.
//
// Close may be called without Start and more than once; a second call
// waits for the first and returns nil. It returns an error if ctx ended
// and an abandoned listener call had still not returned a short grace
// period (one second) after its context was cancelled.
func (o *Outbox) Close(ctx context.Context) error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		<-o.closeDone
		return nil
	}
	o.closed = true
	started := o.started
	o.mu.Unlock()
	defer close(o.closeDone)
	defer defaultOutbox.CompareAndSwap(o, nil)

	if !started {
		o.handBack()
		return nil
	}
	o.stopPoll()
	o.poller.Wait()

	close(o.draining)
	workersDone := make(chan struct{})
	go func() { o.workers.Wait(); close(workersDone) }()
	select {
	case <-workersDone:
	case <-ctx.Done():
		o.cancelRun()
		<-workersDone
	}
	// Batch subscriptions get nothing new now: flush what they hold. An
	// outcome cut by the cancellation puts its item back in a queue,
	// which handBack then empties.
	for _, s := range o.subs.Load().local {
		if s.batch != nil {
			close(s.batch.in)
		}
	}
	batchersDone := make(chan struct{})
	go func() { o.batchers.Wait(); close(batchersDone) }()
	select {
	case <-batchersDone:
	case <-ctx.Done():
		o.cancelRun()
		<-batchersDone
	}
	o.handBack()
	o.comp.stop()
	o.cancelRun()
	o.background.Wait()

	if o.running.Load() == 0 {
		o.stragglers.Wait() // only the last deferred Done calls remain
		return nil
	}
	stragglersDone := make(chan struct{})
	go func() { o.stragglers.Wait(); close(stragglersDone) }()
	select {
	case <-stragglersDone:
		return nil
	case <-ctx.Done():
	}
	// The listeners' contexts are cancelled by now. Give those that honour
	// cancellation a moment to return, so that a listener which does the
	// right thing is never reported as ignoring its context.
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-stragglersDone:
		return nil
	case <-grace.C:
		return fmt.Errorf("outbox: close: %d listener calls that ignored their context are still running: %w", o.running.Load(), ctx.Err())
	}
}

// QueueDepths returns the current lengths of the hot and cold queues.
func (o *Outbox) QueueDepths() (hot, cold int) { return len(o.hot), len(o.cold) }

// --- workers ---

func (o *Outbox) work(ctx context.Context) {
	for {
		var it *item
		select {
		case it = <-o.hot:
		default:
			select {
			case it = <-o.hot:
			case it = <-o.cold:
			case <-ctx.Done():
				return
			case <-o.draining:
				select {
				case it = <-o.hot:
				case it = <-o.cold:
				default:
					return
				}
			}
		}
		if it.path == PathCold {
			select {
			case o.coldSpace <- struct{}{}:
			default:
			}
		}
		if ctx.Err() != nil {
			// Stopping: put it back for handBack. There is room, since
			// it just came out and nothing else sends after Close.
			o.requeue(it)
			return
		}
		o.process(ctx, it)
	}
}

func (o *Outbox) requeue(it *item) {
	q := o.hot
	if it.path == PathCold {
		q = o.cold
	}
	select {
	case q <- it:
	default:
		o.inflight.release(it.key())
	}
}

// errorText makes a listener's error storable on every supported database:
// valid UTF-8 (MySQL and PostgreSQL reject invalid bytes), no NUL
// (PostgreSQL rejects it), at most MaxErrorChars characters.
func errorText(s string) string {
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if utf8.RuneCountInString(s) <= MaxErrorChars {
		return s
	}
	n := 0
	for i := range s {
		if n == MaxErrorChars {
			return s[:i]
		}
		n++
	}
	return s
}

// retryStore retries a store write a few times on error, for transient
// faults such as a dropped connection or a deadlock.
func retryStore[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var v T
	var err error
	for attempt := range 4 {
		if v, err = f(); err == nil || ctx.Err() != nil {
			return v, err
		}
		t := time.NewTimer(time.Duration(25<<attempt) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
	return v, err
}
