package sqlstore

import (
	"context"
	"fmt"
	"slices"

	"github.com/jmoiron/sqlx"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

var _ driver.OwnerReleaser = (*Store)(nil)

// releaseChunk is the most rows ReleaseOwner names in one write.
const releaseChunk = 500

// ReleaseOwner implements driver.OwnerReleaser. It reads, without locking,
// which events and deliveries owner holds, then releases them by primary
// key with Release and ReleaseDeliveries (which check the owner again).
// An UPDATE by owner would have to find the rows through the status index,
// and on MySQL/MariaDB a locking read through a secondary index waits for
// every row another transaction holds: the application's uncommitted
// inserts, other instances' claims. The read finds only what owner holds
// among the pending rows, the table's backlog.
func (s *Store) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	var ids []string
	err := s.retry(ctx, func() error {
		ids = ids[:0]
		return sqlx.SelectContext(ctx, s.db, &ids, s.rebind(`SELECT id FROM `+s.table+` WHERE locked_by = ? AND status IN (0, 2)`), owner)
	})
	if err != nil {
		return 0, fmt.Errorf("sqlstore: release the leases of %s: read the events: %w", owner, s.explain(err))
	}
	var keys []driver.DeliveryID
	err = s.retry(ctx, func() error {
		keys = keys[:0]
		rs, err := s.db.QueryContext(ctx, s.rebind(`SELECT event_id, subscription FROM `+s.DeliveriesTable()+` WHERE locked_by = ? AND status IN (0, 2)`), owner)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var k driver.DeliveryID
			if err := rs.Scan(&k.EventID, &k.Subscription); err != nil {
				return err
			}
			keys = append(keys, k)
		}
		return rs.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("sqlstore: release the leases of %s: read the deliveries: %w", owner, err)
	}
	for chunk := range slices.Chunk(ids, releaseChunk) {
		if err := s.Release(ctx, owner, chunk, 0); err != nil {
			return 0, fmt.Errorf("sqlstore: release the leases of %s: %w", owner, err)
		}
	}
	for chunk := range slices.Chunk(keys, releaseChunk) {
		if err := s.ReleaseDeliveries(ctx, owner, chunk, 0); err != nil {
			return 0, fmt.Errorf("sqlstore: release the delivery leases of %s: %w", owner, err)
		}
	}
	return len(ids) + len(keys), nil
}
