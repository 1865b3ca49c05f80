package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// RetireSubscription implements driver.Retirer in one transaction: the
// registry row (locked, its idle time checked), the version, the
// subscription's NEW and RETRY deliveries, and the split events they were
// the last undone deliveries of.
func (s *Store) RetireSubscription(ctx context.Context, name string, idle time.Duration) (driver.Retired, error) {
	var out driver.Retired
	err := s.inTx(ctx, func(tx *sqlx.Tx) (err error) {
		out = driver.Retired{}
		if out.Registered, err = s.unregister(ctx, tx, name, idle); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, s.rebind(`DELETE FROM `+s.DeliveriesTable()+` WHERE subscription = ? AND status IN (0, 2)`), name)
		if err != nil {
			return err
		}
		if out.Dropped, err = res.RowsAffected(); err != nil || out.Dropped == 0 {
			return err
		}
		// Every split event with nothing left undone: the ones whose last
		// undone deliveries were just dropped (and any other, which a
		// completion would have set DONE already).
		res, err = tx.ExecContext(ctx, `UPDATE `+s.table+` SET status = 1, done_at = `+s.d.now+`
WHERE status = 4 AND NOT EXISTS (SELECT 1 FROM `+s.DeliveriesTable()+` d WHERE d.event_id = `+s.table+`.id AND d.status <> 1)`)
		if err != nil {
			return err
		}
		out.Completed, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return driver.Retired{}, fmt.Errorf("sqlstore: retire subscription %q: %w", name, s.explainSubs(err))
	}
	return out, nil
}

// unregister removes subscription name from the registry in tx, unless an
// instance registered it less than idle ago, and changes the registry's
// version. It reports whether the registry knew it.
func (s *Store) unregister(ctx context.Context, tx *sqlx.Tx, name string, idle time.Duration) (bool, error) {
	lock := ` FOR UPDATE`
	if s.d.name == "sqlite" {
		lock = `` // immediate transactions: one writer at a time
	}
	var seen, now dbTime
	err := tx.QueryRowContext(ctx, s.rebind(`SELECT seen_at, `+s.d.now+` FROM `+s.SubscriptionsTable()+` WHERE name = ?`+lock), name).Scan(&seen, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if ago := now.Sub(seen.Time); ago < idle {
		return true, fmt.Errorf("%w: registered %s ago (retire it once no instance has registered it for %s: remove it from every instance first)",
			driver.ErrSubscriptionLive, ago.Round(time.Millisecond), idle)
	}
	if _, err := tx.ExecContext(ctx, s.rebind(`DELETE FROM `+s.SubscriptionsTable()+` WHERE name = ?`), name); err != nil {
		return false, err
	}
	_, err = tx.ExecContext(ctx, `UPDATE `+s.RegistryTable()+` SET version = version + 1 WHERE id = 1`)
	return true, err
}
