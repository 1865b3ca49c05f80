package inbox

import (
	"context"
	"fmt"
	"strings"
)

// Cleanup deletes the rows of applied and purged messages received more
// than Config.Retention ago, and the failure counts of messages last
// failed that long ago, in batches of Config.CleanupBatch rows (one
// statement each, so no lock is held long). Parked messages stay until
// purged. It returns the number of rows deleted. Run it periodically
// (e.g. hourly); a message redelivered after its row is gone is applied
// again, so the retention must exceed the broker's redelivery horizon.
//
// Each batch is a range scan of the index on (status, received_at) that
// reads the rows it deletes. The inbox table is not partitioned (see
// docs/inbox.md, Retention): Cleanup first checks that its primary key is
// (consumer, message_id), the dedupe, and refuses to run on a table
// whose key was changed, e.g. to partition it by time.
func (ib *Inbox) Cleanup(ctx context.Context) (int64, error) {
	if err := ib.checkPrimaryKey(ctx); err != nil {
		return 0, err
	}
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

// checkPrimaryKey returns an error unless the inbox table's primary key is
// (consumer, message_id).
func (ib *Inbox) checkPrimaryKey(ctx context.Context) error {
	q, args := ib.d.primaryKey(ib.schema, ib.name, ib.inbox)
	rows, err := ib.db.QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("inbox: cleanup: read the primary key of %s: %w", ib.inbox, err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return fmt.Errorf("inbox: cleanup: read the primary key of %s: %w", ib.inbox, err)
		}
		cols = append(cols, strings.ToLower(c))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: cleanup: read the primary key of %s: %w", ib.inbox, err)
	}
	switch key := strings.Join(cols, ", "); key {
	case "consumer, message_id":
		return nil
	case "":
		return fmt.Errorf("inbox: cleanup: %s does not exist or has no primary key: create it with sqlstore's Migrate (migrations/*/006_inbox.sql)", ib.inbox)
	default:
		return fmt.Errorf("inbox: cleanup: the primary key of %s is (%s), not (consumer, message_id): the dedupe no longer holds (a message received again at another time is a new row, applied twice). "+
			"Do not partition the inbox table by time (MySQL and PostgreSQL require the partitioning column in the primary key): restore the key (MySQL: ALTER TABLE %s REMOVE PARTITIONING, then ALTER TABLE %s DROP PRIMARY KEY, ADD PRIMARY KEY (consumer, message_id)) and keep the retention to Cleanup; see docs/inbox.md, Retention",
			ib.inbox, key, ib.inbox, ib.inbox)
	}
}
