package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Schedule implements driver.Scheduler: one UPDATE of the row just
// inserted, through exec (the caller's transaction), on the database's
// clock. The row's created_at becomes its due time too, so that the age
// of a pending event (Stats.OldestPending, StatsByType) counts from when
// it was due, not from its publish.
func (s *Store) Schedule(ctx context.Context, exec driver.Execer, id string, delay time.Duration) error {
	res, err := exec.ExecContext(ctx, s.scheduleSQL(), delay.Microseconds(), id)
	if err != nil {
		return s.explain(err)
	}
	if n, err := res.RowsAffected(); err == nil && n != 1 {
		return fmt.Errorf("sqlstore: schedule event %s: %d rows are it, free and new; want 1 (it must be inserted free in this transaction first)", id, n)
	}
	return nil
}

// scheduleSQL is Schedule's UPDATE; its parameters are the delay in
// microseconds and the id. By primary key only (statusByID): PostgreSQL's
// generic plan of it, made while few rows were pending, read every
// pending row of the (status, available_at) index per call (2–3 ms with
// 20,000 events scheduled, and growing).
func (s *Store) scheduleSQL() string {
	// One due time for both columns: the clock is read once (PostgreSQL's
	// clock_timestamp() moves within a statement).
	q := `UPDATE ` + s.table + ` SET available_at = d.due, created_at = d.due FROM (SELECT ` + s.d.nowPlus + ` AS due) d WHERE id = ? AND ` + s.d.statusByID() + ` = 0 AND locked_by IS NULL`
	if s.d == MySQL {
		// MySQL has no UPDATE … FROM, and assigns left to right: the
		// second column takes the first's new value.
		q = `UPDATE ` + s.table + s.d.byID + ` SET available_at = ` + s.d.nowPlus + `, created_at = available_at WHERE id = ? AND status = 0 AND locked_by IS NULL`
	}
	return s.rebind(q)
}

// Scheduled implements driver.Scheduler, on the (status, available_at)
// index.
func (s *Store) Scheduled(ctx context.Context, dueAfter time.Time, idAfter string, limit int) ([]driver.ScheduledEvent, error) {
	if limit <= 0 {
		return nil, nil
	}
	q := `SELECT id, event_type, aggregate_type, aggregate_id, COALESCE(ordering_key, ''), available_at FROM ` + s.table + `
WHERE status = 0 AND available_at > ` + s.nowBound() + ` AND (locked_by IS NULL OR locked_until <= ` + s.d.now + `)`
	args := []any{}
	if idAfter != "" {
		q += ` AND (available_at > ? OR (available_at = ? AND id > ?))`
		at := s.d.timeArg(dueAfter)
		args = append(args, at, at, idAfter)
	}
	q += ` ORDER BY available_at, id LIMIT ?`
	rows, err := s.db.QueryContext(ctx, s.rebind(q), append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: scheduled: %w", s.explain(err))
	}
	defer rows.Close()
	var out []driver.ScheduledEvent
	for rows.Next() {
		var e driver.ScheduledEvent
		var due dbTime
		if err := rows.Scan(&e.ID, &e.Type, &e.AggregateType, &e.AggregateID, &e.OrderingKey, &due); err != nil {
			return nil, fmt.Errorf("sqlstore: scheduled: %w", err)
		}
		e.Due = due.Time
		out = append(out, e)
	}
	return out, rows.Err()
}

// nextDueSQL reads the earliest due time ahead, on the (status,
// available_at) index from now on, and the database's now.
func (s *Store) nextDueSQL() string {
	return `SELECT (SELECT available_at FROM ` + s.table + ` WHERE status = 0 AND available_at > ` + s.nowBound() + ` AND (locked_by IS NULL OR locked_until <= ` + s.d.now + `) ORDER BY status, available_at LIMIT 1), ` + s.d.now
}

// NextDue implements driver.Scheduler: the first entry of the (status,
// available_at) index past now, and now, both on the database's clock.
// ORDER BY … LIMIT 1, not MIN(): with a condition off the index (the
// lease), MariaDB's MIN read every scheduled row (over a second per call
// with 1,000,000 scheduled); the ordered read stops at the first. On
// PostgreSQL now bounds the index range (Dialect.boundNow): a bare
// clock_timestamp() was a filter, and the read went through every due
// and delivered entry before now.
func (s *Store) NextDue(ctx context.Context) (time.Duration, bool, error) {
	var next, now dbTime
	if err := s.db.QueryRowContext(ctx, s.nextDueSQL()).Scan(&next, &now); err != nil {
		return 0, false, fmt.Errorf("sqlstore: next due: %w", s.explain(err))
	}
	if next.IsZero() {
		return 0, false, nil
	}
	return max(0, next.Sub(now.Time)), true, nil
}

// Cancel implements driver.Scheduler: one guarded UPDATE to DONE (its
// last_error says it was cancelled); if it changed nothing, a read says
// why.
func (s *Store) Cancel(ctx context.Context, id string) (bool, error) {
	q := s.rebind(s.q.update + ` SET status = 1, done_at = ` + s.d.now + `, available_at = ` + s.d.now + `, last_error = 'cancelled before it was due'
WHERE id = ? AND status = 0 AND available_at > ` + s.d.now + ` AND (locked_by IS NULL OR locked_until <= ` + s.d.now + `) AND key_seq IS NULL`)
	n, err := s.execCount(ctx, q, id)
	if err != nil {
		return false, fmt.Errorf("sqlstore: cancel %s: %w", id, s.explain(err))
	}
	if n == 1 {
		return true, nil
	}
	rec, err := s.Inspect(ctx, id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return false, err
	case err != nil:
		return false, fmt.Errorf("sqlstore: cancel %s: %w", id, err)
	case rec.KeySeq > 0:
		return false, driver.ErrOrderedNotCancellable
	}
	return false, nil
}
