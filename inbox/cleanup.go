package inbox

import (
	"context"
	"fmt"
)

// Cleanup deletes the rows of applied and purged messages received more
// than Config.Retention ago, and the failure counts of messages last
// failed that long ago, in batches of Config.CleanupBatch rows (one
// statement each, so no lock is held long). Parked messages stay until
// purged. It returns the number of rows deleted. Run it periodically
// (e.g. hourly); a message redelivered after its row is gone is applied
// again, so the retention must exceed the broker's redelivery horizon.
func (ib *Inbox) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for _, q := range []string{ib.q.expire, ib.q.expireFailures} {
		for {
			n, err := execRows(ctx, ib.db, q, ib.d.age(ib.cfg.Retention), ib.cfg.CleanupBatch)
			total += n
			if err != nil {
				return total, fmt.Errorf("inbox: cleanup: %w", err)
			}
			if n < int64(ib.cfg.CleanupBatch) {
				break
			}
		}
	}
	return total, nil
}
