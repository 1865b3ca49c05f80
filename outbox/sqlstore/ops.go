package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The operator queries on the events table: inspect, stats, dead letters,
// replay and cleanup (see operator.go for those across subscriptions).

// Inspect implements driver.Inspector.
func (s *Store) Inspect(ctx context.Context, id string) (outbox.Record, error) {
	var rec outbox.Record
	r, err := scanRow(s.db.QueryRowContext(ctx, s.q.inspect, id), &rec.LastError)
	if errors.Is(err, sql.ErrNoRows) {
		// Delivered and archived (ArchiveDelivered), or never there:
		// one lookup by primary key more, only for an id the table does
		// not hold.
		return s.inspectArchived(ctx, id)
	}
	if err != nil {
		return rec, fmt.Errorf("sqlstore: inspect %s: %w", id, err)
	}
	rec.Row, rec.Owner = r, r.PrevOwner
	rec.PrevOwner = ""
	if rec.Status == outbox.StatusSplit || rec.Status == outbox.StatusDone || rec.Status == outbox.StatusDead {
		if rec.Deliveries, err = s.inspectDeliveries(ctx, id); err != nil {
			return rec, fmt.Errorf("sqlstore: inspect %s: %w", id, err)
		}
	}
	return rec, nil
}

// Stats implements driver.StatsReader.
func (s *Store) Stats(ctx context.Context) (outbox.Stats, error) {
	var st outbox.Stats
	rs, err := s.db.QueryContext(ctx, s.q.stats)
	if err != nil {
		return st, fmt.Errorf("sqlstore: stats: %w", s.explain(err))
	}
	defer rs.Close()
	for rs.Next() {
		var status int
		var n int64
		if err := rs.Scan(&status, &n); err != nil {
			return st, fmt.Errorf("sqlstore: stats: %w", err)
		}
		switch outbox.Status(status) {
		case outbox.StatusNew:
			st.New = n
		case outbox.StatusDone:
			st.Done = n
		case outbox.StatusRetry:
			st.Retry = n
		case outbox.StatusDead:
			st.Dead = n
		case outbox.StatusSplit:
			st.Split = n
		default:
			st.Unknown += n
		}
	}
	if err := rs.Err(); err != nil {
		return st, fmt.Errorf("sqlstore: stats: %w", err)
	}
	if st.Split > 0 {
		// Dead deliveries belong to split events: none without one.
		q := `SELECT COUNT(*) FROM ` + s.DeliveriesTable() + ` WHERE status = 3`
		if err := s.db.QueryRowContext(ctx, q).Scan(&st.DeadDeliveries); err != nil {
			return st, fmt.Errorf("sqlstore: stats: dead deliveries: %w", s.explainSubs(err))
		}
	}
	if st.Pending() > 0 {
		var oldest, now dbTime
		q := `SELECT MIN(created_at), ` + s.d.now + ` FROM ` + s.table + ` WHERE status IN (0, 2)`
		if err := s.db.QueryRowContext(ctx, q).Scan(&oldest, &now); err != nil {
			return st, fmt.Errorf("sqlstore: stats: oldest pending: %w", err)
		}
		if !oldest.IsZero() {
			st.OldestPending = max(0, now.Sub(oldest.Time))
		}
	}
	return st, nil
}

// ListDead implements driver.DeadLetterStore: FindDead without a filter.
func (s *Store) ListDead(ctx context.Context, after string, limit int) ([]outbox.DeadLetter, error) {
	return s.FindDead(ctx, outbox.DeadFilter{After: after, Limit: limit})
}

// inspectDeliveries returns the deliveries of a split event, each with
// its last failed attempts.
func (s *Store) inspectDeliveries(ctx context.Context, id string) ([]outbox.DeliveryRecord, error) {
	rs, err := s.db.QueryContext(ctx, s.rebind(`SELECT subscription, status, attempts, COALESCE(locked_by, ''), COALESCE(last_error, '') FROM `+s.DeliveriesTable()+` WHERE event_id = ? ORDER BY subscription`), id)
	if err != nil {
		return nil, s.explainSubs(err)
	}
	var out []outbox.DeliveryRecord
	for rs.Next() {
		var d outbox.DeliveryRecord
		var status int
		if err := rs.Scan(&d.Subscription, &status, &d.Attempts, &d.Owner, &d.LastError); err != nil {
			rs.Close()
			return nil, err
		}
		d.Status = outbox.Status(status)
		out = append(out, d)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil || len(out) == 0 {
		return out, err
	}
	rs, err = s.db.QueryContext(ctx, s.rebind(`SELECT subscription, attempt, at, COALESCE(error, '') FROM `+s.AttemptsTable()+` WHERE event_id = ? ORDER BY at DESC, attempt DESC`), id)
	if err != nil {
		return nil, s.explainSubs(err)
	}
	defer rs.Close()
	for rs.Next() {
		var sub string
		var a outbox.Attempt
		var at dbTime
		if err := rs.Scan(&sub, &a.N, &at, &a.Error); err != nil {
			return nil, err
		}
		a.At = at.Time
		for i := range out {
			if out[i].Subscription == sub && len(out[i].History) < driver.MaxHistory {
				out[i].History = append(out[i].History, a)
			}
		}
	}
	return out, rs.Err()
}

// Replay implements driver.DeadLetterStore.
func (s *Store) Replay(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	n, err := s.execCount(ctx, s.replaySQL(len(ids)), s.idArgs(ids)...)
	if err != nil {
		return n, err
	}
	q := s.rebind(`UPDATE ` + s.DeliveriesTable() + ` SET status = 0, attempts = 0, available_at = (SELECT e.created_at FROM ` + s.table + ` e WHERE e.id = event_id), done_at = NULL, locked_by = NULL, locked_until = NULL
WHERE status = 3 AND event_id IN ` + in(len(ids)))
	m, err := s.execCount(ctx, q, stringArgs(ids)...)
	return n + m, s.explainSubs(err)
}

// Cleanup implements driver.Cleaner. It selects the ids first and deletes
// them by primary key, so each call locks at most limit rows. The age is
// measured on the database's clock.
func (s *Store) Cleanup(ctx context.Context, olderThan time.Duration, limit int, includeDead bool) (int64, error) {
	dead := int(outbox.StatusDone)
	if includeDead {
		dead = int(outbox.StatusDead)
	}
	q, args := s.q.cleanup, []any{int(outbox.StatusDone), dead, olderThan.Microseconds(), limit}
	if includeDead {
		// Split events too, once none of their deliveries is pending and
		// the last one ended before the cut-off.
		q = s.rebind(`SELECT id FROM ` + s.table + ` WHERE (status IN (1, 3) OR (status = 4 AND id NOT IN (SELECT event_id FROM ` + s.DeliveriesTable() + `
  WHERE status IN (0, 2) OR done_at >= ` + s.d.nowMinus + `))) AND available_at < ` + s.d.nowMinus + ` ORDER BY available_at LIMIT ?`)
		args = []any{olderThan.Microseconds(), olderThan.Microseconds(), limit}
	}
	rs, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("sqlstore: cleanup: %w", s.explainSubs(err))
	}
	var ids []string
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			rs.Close()
			return 0, fmt.Errorf("sqlstore: cleanup: %w", err)
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return 0, fmt.Errorf("sqlstore: cleanup: %w", err)
	}
	var total int64
	for len(ids) > 0 {
		k := min(len(ids), 500)
		split := int(outbox.StatusDone)
		if includeDead {
			split = int(outbox.StatusSplit) // selected only when finished
		}
		q := s.rebind(`DELETE FROM ` + s.table + ` WHERE ` + s.d.statusByID() + ` IN (?, ?, ?) AND id IN ` + in(k))
		n, err := s.execCount(ctx, q, stringArgs(ids[:k], int(outbox.StatusDone), dead, split)...)
		total += int64(n)
		if err != nil {
			return total, fmt.Errorf("sqlstore: cleanup: %w", err)
		}
		// The deliveries of split events that became DONE go with them.
		dq := s.rebind(`DELETE FROM ` + s.DeliveriesTable() + ` WHERE event_id IN ` + in(k) + ` AND event_id NOT IN (SELECT id FROM ` + s.table + ` WHERE id IN ` + in(k) + `)`)
		if _, err := s.execCount(ctx, dq, append(stringArgs(ids[:k]), stringArgs(ids[:k])...)...); err != nil {
			return total, fmt.Errorf("sqlstore: cleanup of deliveries: %w", err)
		}
		aq := s.rebind(`DELETE FROM ` + s.AttemptsTable() + ` WHERE event_id IN ` + in(k) + ` AND event_id NOT IN (SELECT id FROM ` + s.table + ` WHERE id IN ` + in(k) + `)`)
		if _, err := s.execCount(ctx, aq, append(stringArgs(ids[:k]), stringArgs(ids[:k])...)...); err != nil {
			return total, fmt.Errorf("sqlstore: cleanup of attempts: %w", err)
		}
		ids = ids[k:]
	}
	return total, nil
}
