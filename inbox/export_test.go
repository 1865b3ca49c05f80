package inbox

import "context"

// ExpireBatch runs one batch of Cleanup's first statement (applied and
// purged rows) and returns the rows it deleted.
func (ib *Inbox) ExpireBatch(ctx context.Context) (int64, error) {
	return execRows(ctx, ib.db, ib.q.expire, ib.d.age(ib.cfg.Retention), ib.cfg.CleanupBatch)
}

// ExpireSQL returns that statement and its arguments.
func (ib *Inbox) ExpireSQL() (string, []any) {
	return ib.q.expire, []any{ib.d.age(ib.cfg.Retention), ib.cfg.CleanupBatch}
}
