package outbox

import (
	"context"
	"fmt"
	"log/slog"
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
	var keys []DeliveryKey
	var items []*item
	for {
		var it *item
		select {
		case it = <-o.hot:
		case it = <-o.cold:
		default:
		}
		if it == nil {
			break
		}
		items = append(items, it)
		if it.sub == nil {
			ids = append(ids, it.env.ID)
		} else {
			keys = append(keys, DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
		}
	}
	if len(items) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	o.releaseLeases(ctx, ids, "release leases on close")
	o.releaseDeliveries(ctx, keys, 0, "release deliveries on close")
	for _, it := range items {
		o.inflight.release(it.key())
	}
	o.log.Info("handed queued events back to the database", slog.Int("events", len(items)))
}

// releaseDeliveries is releaseAfter for deliveries.
func (o *Outbox) releaseDeliveries(ctx context.Context, keys []DeliveryKey, delay time.Duration, what string) {
	for len(keys) > 0 {
		n := min(500, len(keys))
		if err := o.dstore.ReleaseDeliveries(ctx, o.cfg.InstanceID, keys[:n], delay); err != nil {
			o.log.Error(what, slog.Int("deliveries", n), slog.Any("error", err))
		}
		keys = keys[n:]
	}
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

// --- completion writer ---

// complete marks delivered events DONE in batches: it takes what the
// workers have finished, waiting up to CompletionLinger for more, up to
// CompletionBatchSize, writes one statement, and repeats.
func (o *Outbox) complete() {
	batch := make([]*item, 0, o.cfg.CompletionBatchSize)
	ids := make([]string, 0, o.cfg.CompletionBatchSize)
	var keys []DeliveryKey
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
		keys = keys[:0]
		for _, it := range batch {
			if it.sub == nil {
				ids = append(ids, it.env.ID)
			} else {
				keys = append(keys, DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
			}
		}
		if len(ids) > 0 {
			o.markDone(ids)
		}
		if len(keys) > 0 {
			o.completeDeliveries(keys)
		}
		for _, it := range batch {
			o.inflight.release(it.key())
		}
	}
}

func (o *Outbox) completeDeliveries(keys []DeliveryKey) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	n, err := retryStore(ctx, func() (int, error) { return o.dstore.CompleteDeliveries(ctx, o.cfg.InstanceID, keys) })
	if err != nil {
		o.log.Error("mark deliveries done; they will be delivered again", slog.Int("deliveries", len(keys)), slog.Any("error", err))
		return
	}
	if n < len(keys) {
		o.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("deliveries", len(keys)-n))
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
		var ids []string
		var keys []DeliveryKey
		for _, k := range o.inflight.snapshot() {
			if dk, ok := parseDeliveryKey(k); ok {
				keys = append(keys, dk)
			} else {
				ids = append(ids, k)
			}
		}
		for len(keys) > 0 {
			n := min(500, len(keys))
			wctx, cancel := context.WithTimeout(ctx, o.cfg.Lease/3)
			if _, err := o.dstore.ExtendDeliveryLeases(wctx, o.cfg.InstanceID, keys[:n], o.cfg.Lease); err != nil && ctx.Err() == nil {
				o.log.Error("renew delivery leases", slog.Int("deliveries", n), slog.Any("error", err))
			}
			cancel()
			keys = keys[n:]
		}
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
