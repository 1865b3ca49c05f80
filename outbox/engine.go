package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// storeTimeout bounds the engine's own writes (completion, retry, lease
// renewal) so that a hung database cannot hold a worker forever.
const storeTimeout = 15 * time.Second

// Start launches the workers, the completion writer, the lease renewer, the
// sampler and (unless disabled) the poller, and returns at once. The engine
// runs until Close; cancelling ctx stops it without draining, and Close must
// still be called. A cancellation before Close is a mistake (requests go on
// publishing, and nothing delivers): it is logged at ERROR, once, and
// Health (LiveHandler, ReadyHandler) reports the instance neither live
// nor ready from then on. To drain on shutdown, give Start a context that outlives
// the shutdown signal (context.WithoutCancel(ctx)) and let Close stop the
// engine. Calling Start again does nothing; after Close it returns
// ErrClosed.
func (o *Outbox) Start(ctx context.Context) error {
	o.startMu.Lock()
	defer o.startMu.Unlock()
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return ErrClosed
	}
	if o.started {
		o.mu.Unlock()
		return nil
	}
	o.starting = true // Subscribe refuses from here
	o.mu.Unlock()
	err := o.reg.sync(ctx)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starting = false
	if err != nil {
		return fmt.Errorf("outbox: Start: register the subscriptions: %w", err)
	}
	if o.closed {
		return ErrClosed // Close came meanwhile, and found nothing started
	}
	o.started = true
	o.stopWatch = context.AfterFunc(ctx, func() { o.startCancelled(ctx) })
	// Every part stops by the end of the engine's life at the latest,
	// whenever Close comes to stop it: each has then had Close's last
	// grace period to return before Close gives up waiting for it.
	ctx, stopParts := context.WithCancel(ctx)
	context.AfterFunc(o.life, stopParts)
	o.health.pollBeat.Store(time.Now().UnixNano())
	o.m.QueueCapacities(cap(o.disp.hot), cap(o.disp.cold))
	o.disp.start(ctx, o.reg.load().local)
	o.reg.start(ctx, o.reg.run)
	o.comp.start()
	o.leases.start(ctx, o.leases.run)
	o.sampler.start(ctx, o.sampler.run)
	if o.cfg.Retention > 0 || o.cfg.ArchiveRetention > 0 {
		o.cleaner.start(ctx, o.cleaner.run)
	}
	if !o.cfg.DisablePoller {
		o.poller.start(ctx, o.poller.run)
	}
	if o.seq.ostore != nil && len(o.reg.load().local) > 0 {
		o.seq.start(ctx, o.seq.run)
	}
	return nil
}

// startCancelled reports, once, that Start's context ended before Close:
// the engine has stopped delivering, silently but for this, while Publish
// still writes events and requests still succeed. Health then reports
// the instance neither live nor ready.
func (o *Outbox) startCancelled(ctx context.Context) {
	o.mu.RLock()
	closed := o.closed
	o.mu.RUnlock()
	if closed {
		return
	}
	cause := context.Cause(ctx)
	if !o.health.startCancelled.CompareAndSwap(nil, &cause) {
		return
	}
	o.log.Error("the context given to Start was cancelled before Close: delivery has stopped, while Publish still writes events (they wait in the table for an instance that runs); give Start a context that lives until Close, e.g. context.WithoutCancel(ctx), and stop the engine with Close",
		slog.Any("cause", cause))
}

// Close stops the engine: it stops the poller, lets the workers deliver
// what is queued until ctx is done, then cancels the handlers still
// running, hands the rest back to the database, writes the last
// completions, waits for every goroutine it started, and last releases
// every lease this instance still holds (driver.OwnerReleaser), so that
// any instance can take those events at once: what it handed back, and
// whatever Close cut short on the way (a claim that answered late, a DONE
// it could not write). Events published after Close stay in the table
// for the poller of another or the next instance.
//
// Close returns soon after ctx ends even when the database does not
// answer: the engine's writes end a grace period (one second) after ctx,
// answered or not, and the parts get one more to return. The last
// release, the one write Close must finish, has its own bound of five
// seconds from when it starts, whatever ctx. What Close could not write is
// delivered again once its lease runs out (at least once; nothing is
// lost). A database call that ignores its context (go-sql-driver/mysql
// cannot cut a COMMIT short) is not waited for past the second grace
// period: Close returns an error naming the part still inside it, whose
// goroutine ends when the call returns; a claim that call commits after
// the last release stays leased to this instance until its lease runs
// out. Setting readTimeout and writeTimeout in a MySQL DSN bounds such
// calls.
//
// Close may be called without Start and more than once; a second call
// waits for the first and returns nil. It returns an error if ctx ended
// and an abandoned handler call had still not returned the grace period
// after its context was cancelled, and one that names the order if the
// store's *sql.DB was closed before it: close the Outbox first.
func (o *Outbox) Close(ctx context.Context) error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		<-o.closeDone
		return nil
	}
	o.closed = true
	started := o.started
	if o.stopWatch != nil {
		o.stopWatch()
	}
	o.mu.Unlock()
	defer close(o.closeDone)
	defer defaultOutbox.CompareAndSwap(o, nil)
	// The engine's writes from here on (hand-backs, the last completions)
	// end closeGrace after ctx, answered or not: a database that does not
	// answer costs Close no more than that. What they could not write is
	// at least once still: leases run out, and the events go out again.
	// The parts then have closeGrace more to return.
	closing := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-closing:
			return
		case <-ctx.Done():
		}
		t := time.NewTimer(closeGrace)
		defer t.Stop()
		for _, end := range []context.CancelFunc{o.endLife, o.endWait} {
			select {
			case <-closing:
				return
			case <-t.C:
				end()
				t.Reset(closeGrace)
			}
		}
	})
	defer func() {
		close(closing)
		watch.Wait()
	}()

	if !started {
		// Only what Publish leased here, waiting for Start, can be held.
		if o.disp.handBack() > 0 || len(o.poller.dropped) > 0 {
			return o.releaseHeld(ctx)
		}
		return nil
	}
	// In order: nothing new is claimed; what is queued is delivered (or
	// handed back); the last completions are written; then the rest.
	var stuck []string
	stop := func(part string, stopped bool) {
		if !stopped {
			stuck = append(stuck, part)
		}
	}
	stop("poller", o.poller.stop(o.patience))
	stop("sequencer", o.seq.stop(o.patience))
	stuck = append(stuck, o.disp.drain(ctx, o.reg.load().local)...)
	// Events given back to the poller's list of leases to release after
	// its last cycle (behind one of their key that failed, or dropped from
	// a full queue) would stay leased to this instance, and their keys
	// stalled, until the lease ran out: release them now.
	o.poller.releaseDropped()
	stop("failure hooks", o.hooks.stop(ctx, o.patience))
	stop("completer", o.comp.stop(o.patience))
	stop("lease keeper", o.leases.stop(o.patience))
	stop("registrar", o.reg.stop(o.patience))
	stop("sampler", o.sampler.stop(o.patience))
	stop("cleaner", o.cleaner.stop(o.patience))
	err := o.disp.waitStragglers(ctx)
	err = errors.Join(err, o.releaseHeld(ctx))
	if len(stuck) > 0 {
		err = errors.Join(err, fmt.Errorf("outbox: close: the %s did not return: blocked in a database call that ignores its context (on MySQL, a COMMIT on a connection that stopped answering); it returns when the driver does", strings.Join(stuck, ", ")))
	}
	return err
}

// releaseTimeout bounds Close's last write, the release of every lease
// the instance still holds, from when it starts: it is not cut short with
// the engine's other writes, so that a machine too loaded to finish them
// within the grace period still leaves nothing leased to the closed
// instance.
const releaseTimeout = 5 * time.Second

// releaseHeld gives up every lease this instance holds, once nothing of
// it runs any more (Close's last step). Instance ids are unique among live
// instances (Config.InstanceID), so it takes nothing from another. A part
// Close gave up waiting for may still commit a claim after it: that claim
// waits out its lease. It returns an error only for a database handle
// closed before the Outbox, a mistake of order in the caller's shutdown
// that nothing else would report; other failures are logged, and leases
// run out.
func (o *Outbox) releaseHeld(ctx context.Context) error {
	r, ok := o.store.(driver.OwnerReleaser)
	if !ok {
		return nil // handBack released what was queued, by id
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	start := time.Now()
	n, err := r.ReleaseOwner(ctx, o.cfg.InstanceID)
	o.m.Statement("release", n, time.Since(start))
	if err != nil {
		o.log.Error("release the leases left on close; their events are delivered again once the leases run out", slog.Any("error", err))
		if dbClosed(err) {
			return fmt.Errorf("outbox: close: the database handle was closed before the Outbox, so the last completions and the release of this instance's leases were not written (their events go out again once the leases run out): close the Outbox before the *sql.DB (call ob.Close, then db.Close; with defer, defer db.Close() first): %w", err)
		}
		return nil
	}
	if n > 0 {
		o.log.Info("released the leases left on close", slog.Int("leases", n))
	}
	return nil
}

// dbClosed reports whether err is database/sql's error for a *sql.DB
// used after its Close. database/sql does not export it; its text has
// not changed since Go 1.0.
func dbClosed(err error) bool {
	return strings.Contains(err.Error(), "sql: database is closed")
}

// QueueDepths returns the current lengths of the hot and cold queues.
func (o *Outbox) QueueDepths() (hot, cold int) { return len(o.disp.hot), len(o.disp.cold) }

// --- workers ---

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
// faults such as a dropped connection or a deadlock. A refusal for a
// stale registry (driver.ErrRegistryChanged) is returned at once: it
// would only be refused again.
func retryStore[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var v T
	var err error
	for attempt := range 4 {
		if v, err = f(); err == nil || ctx.Err() != nil || fenced(err) {
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
