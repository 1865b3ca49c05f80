package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Background work: the sampler of queue depths and backlog, and the
// retention cleanup.

func (o *Outbox) sample(ctx context.Context) {
	depth := time.NewTicker(time.Second)
	defer depth.Stop()
	var stats <-chan time.Time
	sr, ok := o.store.(driver.StatsReader)
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
			if _, ok := o.store.(driver.OperatorStore); ok {
				lctx, cancel := context.WithTimeout(ctx, o.cfg.StatsInterval)
				lags, err := o.Lag(lctx)
				cancel()
				if err == nil {
					o.m.SubscriptionLag(lags)
				} else if ctx.Err() == nil {
					o.log.Error("sample the subscriptions' lag", slog.Any("error", err))
				}
			}
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
	c := o.store.(driver.Cleaner) // checked by New
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
func (o *Outbox) cleanup(ctx context.Context, c driver.Cleaner) {
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
