package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// sampler reports the queue depths, the backlog and the subscriptions'
// lag to Metrics every StatsInterval.
type sampler struct {
	*deps
	disp *dispatcher
	lag  func(context.Context) ([]Lag, error)
	runner
}

// cleaner deletes delivered rows older than Config.Retention, and
// archived ones older than Config.ArchiveRetention, at start and every
// CleanupInterval.
type cleaner struct {
	*deps
	runner
}

// runner owns the one goroutine of a part: start launches it, stop
// cancels its context and waits for it.
type runner struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the goroutine has returned
}

func (r *runner) start(ctx context.Context, run func(context.Context)) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		run(ctx)
	}()
}

// stop cancels the goroutine's context and waits for it to return, or
// for until to end (Close's patience: a grace period after the engine's
// life, which cancelled every part's context). A goroutine still running
// then is inside a database call that ignores its context (a MySQL COMMIT
// on a connection that stopped answering): it cannot be cut short, and
// returns when that call does, on its own. stop reports whether the
// goroutine returned.
func (r *runner) stop(until context.Context) bool {
	if r.cancel == nil {
		return true
	}
	r.cancel()
	return waitUntil(r.done, until)
}

// waitUntil waits for done or for until to end; it reports whether done
// was closed.
func waitUntil(done <-chan struct{}, until context.Context) bool {
	select {
	case <-done:
		return true
	case <-until.Done():
	}
	select {
	case <-done:
		return true
	default:
		return false
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

func (sm *sampler) run(ctx context.Context) {
	depth := time.NewTicker(time.Second)
	defer depth.Stop()
	var stats <-chan time.Time
	sr, ok := sm.store.(driver.StatsReader)
	if ok && sm.cfg.StatsInterval > 0 {
		t := time.NewTicker(sm.cfg.StatsInterval)
		defer t.Stop()
		stats = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-depth.C:
			sm.m.QueueDepths(len(sm.disp.hot), len(sm.disp.cold))
		case <-stats:
			wctx, cancel := context.WithTimeout(ctx, sm.cfg.StatsInterval)
			s, err := sr.Stats(wctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					sm.log.Error("sample backlog", slog.Any("error", err))
				}
				continue
			}
			sm.m.Backlog(s)
			if _, ok := sm.store.(driver.OperatorStore); ok {
				lctx, cancel := context.WithTimeout(ctx, sm.cfg.StatsInterval)
				lags, err := sm.lag(lctx)
				cancel()
				if err == nil {
					sm.m.SubscriptionLag(lags)
				} else if ctx.Err() == nil {
					sm.log.Error("sample the subscriptions' lag", slog.Any("error", err))
				}
			}
			if s.Unknown > 0 {
				sm.log.Warn("rows with a status this engine does not know: they are never delivered; inspect them (SELECT status, COUNT(*) … GROUP BY status) and fix or delete them",
					slog.Int64("rows", s.Unknown))
			}
		}
	}
}

// run deletes delivered rows older than Config.Retention, and archived
// ones older than Config.ArchiveRetention, at start and then every
// CleanupInterval, until ctx ends.
func (cl *cleaner) run(ctx context.Context) {
	t := time.NewTicker(cl.cfg.CleanupInterval)
	defer t.Stop()
	for {
		if cl.cfg.Retention > 0 {
			c := cl.store.(driver.Cleaner) // checked by New
			cl.cleanup(ctx, "delivered events", func(ctx context.Context) (int64, error) {
				return c.Cleanup(ctx, cl.cfg.Retention, cl.cfg.CleanupBatchSize, cl.cfg.CleanupDead)
			}, slog.Duration("older_than", cl.cfg.Retention), slog.Bool("dead_too", cl.cfg.CleanupDead))
		}
		if cl.cfg.ArchiveRetention > 0 {
			a := cl.store.(driver.Archiver) // checked by New
			cl.cleanup(ctx, "the archive", func(ctx context.Context) (int64, error) {
				return a.CleanupArchive(ctx, cl.cfg.ArchiveRetention, cl.cfg.CleanupBatchSize)
			}, slog.Duration("older_than", cl.cfg.ArchiveRetention))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// cleanup runs one cleanup of what: batches until fewer than a batch is
// left.
func (cl *cleaner) cleanup(ctx context.Context, what string, batch func(context.Context) (int64, error), attrs ...any) {
	var total int64
	for ctx.Err() == nil {
		n, err := batch(ctx)
		total += n
		cl.m.Cleaned(n)
		if err != nil {
			if ctx.Err() == nil {
				cl.log.Error("cleanup of "+what+" failed", slog.Int64("deleted", total), slog.Any("error", err))
			}
			return
		}
		if n < int64(cl.cfg.CleanupBatchSize) {
			break
		}
	}
	if total > 0 {
		cl.log.Info("cleanup deleted "+what, append([]any{slog.Int64("deleted", total)}, attrs...)...)
	}
}
