package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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
	o.started = true
	o.m.QueueCapacities(cap(o.hot), cap(o.cold))
	runCtx, cancel := context.WithCancel(ctx)
	o.cancelRun = cancel
	for range o.cfg.Workers {
		o.workers.Go(func() { o.work(runCtx) })
	}
	o.completer.Go(o.complete)
	o.background.Go(func() { o.renewLeases(runCtx) })
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
	o.handBack()
	close(o.doneCh)
	o.completer.Wait()
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

// handBack empties the queues and releases the leases of what was in them.
func (o *Outbox) handBack() {
	var ids []string
	for {
		select {
		case it := <-o.hot:
			ids = append(ids, it.env.ID)
			continue
		case it := <-o.cold:
			ids = append(ids, it.env.ID)
			continue
		default:
		}
		break
	}
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	o.releaseLeases(ctx, ids, "release leases on close")
	for _, id := range ids {
		o.inflight.release(id)
	}
	o.log.Info("handed queued events back to the database", slog.Int("events", len(ids)))
}

// releaseLeases gives up this instance's leases on ids, in statements of
// at most 500 ids. A failure is logged, not returned: the leases then run
// out by themselves and the events are delivered later, never lost.
func (o *Outbox) releaseLeases(ctx context.Context, ids []string, what string) {
	o.releaseAfter(ctx, ids, 0, what)
}

// releaseAfter is releaseLeases with the events due again only after
// delay.
func (o *Outbox) releaseAfter(ctx context.Context, ids []string, delay time.Duration, what string) {
	for chunk := range chunks(ids, 500) {
		if err := o.store.Release(ctx, o.cfg.InstanceID, chunk, delay); err != nil {
			o.log.Error(what, slog.Int("events", len(chunk)), slog.Any("error", err))
		}
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
		o.inflight.release(it.env.ID)
	}
}

// process runs the listeners of one event and records the outcome.
func (o *Outbox) process(ctx context.Context, it *item) {
	start := time.Now()
	if it.attempts == 0 {
		o.m.Latency(it.path, start.Sub(it.since))
	}
	ev := Event{Envelope: it.env, Attempt: it.attempts + 1, Path: it.path}
	ls := o.listeners.Load().listenersFor(ev.Type)
	if len(ls) == 0 {
		// Never mark DONE what no listener here accepted: give it back
		// for an instance that has a listener (no attempt spent).
		o.noListener(it.env.ID, it.env.Type)
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		o.releaseAfter(ctx, []string{it.env.ID}, o.cfg.NoListenerDelay, "hand back an event with no listener here")
		cancel()
		o.inflight.release(it.env.ID)
		return
	}
	var err error
	for i, l := range ls {
		if err = o.call(ctx, l, ev); err != nil {
			err = &ListenerError{Index: i, Err: err}
			break
		}
	}
	took := time.Since(start)
	if err != nil && ctx.Err() != nil {
		// Shutdown cancelled the listener: not the event's fault. Hand it
		// back without counting an attempt.
		o.requeue(it)
		return
	}
	if err == nil {
		o.m.Dispatched(it.env.Type, it.path, OutcomeDone, took)
		o.doneCh <- it // the completer releases it after the write
		return
	}
	o.fail(it, err, took)
}

// ListenerError reports the listener that failed an attempt.
type ListenerError struct {
	Index int // the listener's position among those run for the event
	Err   error
}

func (e *ListenerError) Error() string { return fmt.Sprintf("listener %d: %v", e.Index, e.Err) }
func (e *ListenerError) Unwrap() error { return e.Err }

func (o *Outbox) fail(it *item, err error, took time.Duration) {
	failures := it.attempts + 1
	text := errorText(err.Error())
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	attrs := []any{slog.String("event_id", it.env.ID), slog.String("event_type", string(it.env.Type)),
		slog.Int("attempt", failures), slog.String("path", string(it.path)), slog.String("error", text)}
	dead := o.cfg.Classify(err) == Dead || failures >= o.cfg.MaxAttempts
	var delay time.Duration
	write := func(text string) (bool, error) {
		return retryStore(ctx, func() (bool, error) {
			if dead {
				return o.store.MarkDead(ctx, o.cfg.InstanceID, it.env.ID, text)
			}
			return o.store.MarkRetry(ctx, o.cfg.InstanceID, it.env.ID, delay, text)
		})
	}
	if dead {
		o.m.Dispatched(it.env.Type, it.path, OutcomeDead, took)
		o.log.Error("event is dead: delivery failed for the last time", attrs...)
	} else {
		delay = o.cfg.Retry.Delay(failures)
		o.m.Dispatched(it.env.Type, it.path, OutcomeRetry, took)
		o.log.Warn("delivery failed; will retry", append(attrs, slog.Duration("retry_in", delay))...)
	}
	// The event leaves this instance's hands with the write that gives up
	// its lease: from then on a claim (here too) may take it again, and
	// must find it free in the in-flight set. Until the write, the live
	// lease keeps every claim off it.
	o.inflight.release(it.env.ID)
	held, werr := write(text)
	if werr != nil && ctx.Err() == nil {
		// The database refused the outcome itself (the text, a column, a
		// trigger): record the attempt with a text it cannot refuse, so
		// that attempts still advance and the event reaches DEAD rather
		// than being delivered again every lease.
		o.log.Error("record failed delivery; recording it without the error text", slog.String("event_id", it.env.ID), slog.Any("error", werr))
		held, werr = write(errorText("outbox: the listener's error could not be stored: " + werr.Error()))
		if werr != nil {
			held, werr = write("outbox: the listener's error could not be stored")
		}
	}
	switch {
	case werr != nil:
		o.log.Error("record failed delivery; the event is delivered again when its lease expires", slog.String("event_id", it.env.ID), slog.Any("error", werr))
	case !held:
		o.log.Warn("lease lost: another instance owns the event; outcome not recorded", slog.String("event_id", it.env.ID))
	case !dead:
		o.scheduleRetryWake(time.Now().Add(delay))
	}
}

// call runs one listener with a timeout, containing panics. A listener that
// ignores its cancelled context is abandoned: the worker moves on, and Close
// waits for the abandoned call.
func (o *Outbox) call(ctx context.Context, l Listener, ev Event) error {
	if o.cfg.ListenerTimeout < 0 {
		return safeCall(ctx, l, ev)
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.ListenerTimeout)
	defer cancel()
	done := make(chan error, 1)
	o.stragglers.Add(1)
	o.running.Add(1)
	go func() {
		defer o.stragglers.Done()
		defer o.running.Add(-1) // runs before Done: see Close
		done <- safeCall(ctx, l, ev)
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
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("outbox: listener did not return within %v: %w", o.cfg.ListenerTimeout, ctx.Err())
		}
		return fmt.Errorf("outbox: listener cancelled: %w", ctx.Err())
	}
}

// PanicError is the error of a listener that panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("outbox: listener panicked: %v", e.Value) }

func safeCall(ctx context.Context, l Listener, ev Event) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return l(ctx, ev)
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

// --- completion writer ---

// complete marks delivered events DONE in batches: it takes what the
// workers have finished, waiting up to CompletionLinger for more, up to
// CompletionBatchSize, writes one statement, and repeats.
func (o *Outbox) complete() {
	batch := make([]*item, 0, o.cfg.CompletionBatchSize)
	ids := make([]string, 0, o.cfg.CompletionBatchSize)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for it := range o.doneCh {
		batch = append(batch[:0], it)
		var lingered <-chan time.Time // nil: do not wait
		if o.cfg.CompletionLinger > 0 {
			linger.Reset(o.cfg.CompletionLinger)
			lingered = linger.C
		}
	fill:
		for len(batch) < o.cfg.CompletionBatchSize {
			select {
			case it, ok := <-o.doneCh:
				if !ok {
					break fill // closing: write what there is now
				}
				batch = append(batch, it)
				continue
			default:
			}
			if lingered == nil {
				break
			}
			select {
			case it, ok := <-o.doneCh:
				if !ok {
					break fill
				}
				batch = append(batch, it)
			case <-lingered:
				break fill
			}
		}
		linger.Stop()
		ids = ids[:0]
		for _, it := range batch {
			ids = append(ids, it.env.ID)
		}
		o.markDone(ids)
		for _, id := range ids {
			o.inflight.release(id)
		}
	}
}

func (o *Outbox) markDone(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	n, err := retryStore(ctx, func() (int, error) { return o.store.MarkDone(ctx, o.cfg.InstanceID, ids) })
	if err != nil {
		// The rows keep their lease and are delivered again once it
		// expires: at least once, never lost.
		o.log.Error("mark events done; they will be delivered again", slog.Int("events", len(ids)), slog.Any("error", err))
		return
	}
	if n < len(ids) {
		o.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("events", len(ids)-n))
	}
}

// --- lease renewal and sampling ---

func (o *Outbox) renewLeases(ctx context.Context) {
	t := time.NewTicker(o.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids := o.inflight.snapshot()
		for chunk := range chunks(ids, 500) {
			wctx, cancel := context.WithTimeout(ctx, o.cfg.Lease/3)
			if _, err := o.store.ExtendLeases(wctx, o.cfg.InstanceID, chunk, o.cfg.Lease); err != nil && ctx.Err() == nil {
				o.log.Error("renew leases", slog.Int("events", len(chunk)), slog.Any("error", err))
			}
			cancel()
		}
	}
}

func (o *Outbox) sample(ctx context.Context) {
	depth := time.NewTicker(time.Second)
	defer depth.Stop()
	var stats <-chan time.Time
	sr, ok := o.store.(StatsReader)
	if ok && o.cfg.StatsInterval > 0 {
		t := time.NewTicker(o.cfg.StatsInterval)
		defer t.Stop()
		stats = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-depth.C:
			o.m.QueueDepths(len(o.hot), len(o.cold))
		case <-stats:
			wctx, cancel := context.WithTimeout(ctx, o.cfg.StatsInterval)
			s, err := sr.Stats(wctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					o.log.Error("sample backlog", slog.Any("error", err))
				}
				continue
			}
			o.m.Backlog(s)
			if s.Unknown > 0 {
				o.log.Warn("rows with a status this engine does not know: they are never delivered; inspect them (SELECT status, COUNT(*) … GROUP BY status) and fix or delete them",
					slog.Int64("rows", s.Unknown))
			}
		}
	}
}

// chunks yields s in pieces of at most n.
func chunks(s []string, n int) func(func([]string) bool) {
	return func(yield func([]string) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// cleanupLoop deletes delivered rows older than Config.Retention at start
// and then every CleanupInterval, until ctx ends.
func (o *Outbox) cleanupLoop(ctx context.Context) {
	c := o.store.(Cleaner) // checked by New
	t := time.NewTicker(o.cfg.CleanupInterval)
	defer t.Stop()
	for {
		o.cleanup(ctx, c)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// cleanup runs one cleanup: batches until fewer than a batch is left.
func (o *Outbox) cleanup(ctx context.Context, c Cleaner) {
	var total int64
	for ctx.Err() == nil {
		n, err := c.Cleanup(ctx, o.cfg.Retention, o.cfg.CleanupBatchSize, o.cfg.CleanupDead)
		total += n
		o.m.Cleaned(n)
		if err != nil {
			if ctx.Err() == nil {
				o.log.Error("cleanup of delivered events failed", slog.Int64("deleted", total), slog.Any("error", err))
			}
			return
		}
		if n < int64(o.cfg.CleanupBatchSize) {
			break
		}
	}
	if total > 0 {
		o.log.Info("cleanup deleted delivered events", slog.Int64("deleted", total),
			slog.Duration("older_than", o.cfg.Retention), slog.Bool("dead_too", o.cfg.CleanupDead))
	}
}
