package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The claim: one short transaction that leases due rows to an instance.

// Claim implements driver.Store: one short transaction (READ COMMITTED on
// MySQL and PostgreSQL, so it does not block concurrent inserts) selects
// due rows with FOR UPDATE SKIP LOCKED and leases them to req.Owner; on
// MySQL/MariaDB the rows are found first by plain reads and locked by
// primary key (see Dialect.findFirst). Deadlocks and lock-wait timeouts
// are retried.
func (s *Store) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if req.Limit <= 0 {
		return nil, nil
	}
	var rows []driver.Row
	err := s.retry(ctx, func() error {
		var err error
		rows, err = s.claimOnce(ctx, req)
		return err
	})
	return rows, s.explain(err)
}

func (s *Store) claimOnce(ctx context.Context, req driver.ClaimRequest) (_ []driver.Row, err error) {
	if s.d.findFirst {
		return s.claimFound(ctx, req)
	}
	tx, err := s.beginClaim(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rollback(tx))
		}
	}()
	sel := func(out []driver.Row, at bool, q string, args ...any) ([]driver.Row, any, error) {
		return selectRows(ctx, tx, out, at, q, args...)
	}
	// Due retries first, up to a quarter of the batch so that a backlog of
	// new events cannot starve them, then new events for the rest.
	cs, targs := s.claimSetFor(req)
	out, _, err := sel(nil, false, cs.retry, withArgs(targs, max(1, req.Limit/4))...)
	if err != nil {
		return nil, err
	}
	if out, err = s.claimNewRows(sel, out, req); err != nil {
		return nil, err
	}
	return s.leaseClaimed(ctx, tx, req, out)
}

// claimFound is the claim of a dialect that finds first (see
// Dialect.findFirst): plain reads of the due rows' ids, outside any
// transaction (a poll that finds nothing due costs one or two reads and
// holds no lock), then one short transaction that locks those rows by
// primary key, skipping the ones another claim holds, decides the WHERE
// again on each, and leases what it locked.
func (s *Store) claimFound(ctx context.Context, req driver.ClaimRequest) (_ []driver.Row, err error) {
	sel := func(out []driver.Row, at bool, q string, args ...any) ([]driver.Row, any, error) {
		return s.findRows(ctx, out, at, q, args...)
	}
	cs, targs := s.claimSetFor(req)
	found, _, err := sel(nil, false, cs.retry, withArgs(targs, max(1, req.Limit/4))...)
	if err != nil {
		return nil, err
	}
	if found, err = s.claimNewRows(sel, found, req); err != nil || len(found) == 0 {
		return nil, err
	}
	ids := make([]string, len(found))
	for i := range found {
		ids[i] = found[i].ID
	}
	tx, err := s.beginClaim(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rollback(tx))
		}
	}()
	rs, err := tx.QueryContext(ctx, s.claimLockSQL(len(ids)), s.idArgs(ids, max(0, req.SkipRecent.Microseconds()))...)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim: lock: %w", err)
	}
	out, err := lockedInOrder(rs, found)
	if err != nil {
		return nil, err
	}
	return s.leaseClaimed(ctx, tx, req, out)
}

// lockedInOrder reads the rows of rs, the locking read of found's ids,
// and returns them in the order found (retries, then by due time): each
// into found's slot of its id, the slots of rows not locked dropped. It
// reuses found's array and closes rs.
func lockedInOrder(rs *sql.Rows, found []driver.Row) ([]driver.Row, error) {
	slot := make(map[string]int, len(found))
	for i := range found {
		slot[found[i].ID] = i
	}
	got := make([]bool, len(found))
	for rs.Next() {
		r, err := scanRow(rs)
		if err != nil {
			rs.Close()
			return nil, fmt.Errorf("sqlstore: claim: scan: %w", err)
		}
		if i, ok := slot[r.ID]; ok {
			found[i], got[i] = r, true
		}
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, fmt.Errorf("sqlstore: claim: lock: %w", err)
	}
	out := found[:0]
	for i := range found {
		if got[i] {
			out = append(out, found[i])
		}
	}
	return out, nil
}

// beginClaim begins a claim's transaction, READ COMMITTED where the
// dialect has it, with the dialect's planner settings for the claim
// (Dialect.claimPlan).
func (s *Store) beginClaim(ctx context.Context) (*sqlx.Tx, error) {
	opts := &sql.TxOptions{}
	if s.d.readCommitted {
		opts.Isolation = sql.LevelReadCommitted
	}
	tx, err := s.db.BeginTxx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim: begin: %w", err)
	}
	if s.d.claimPlan != "" {
		if _, err := tx.ExecContext(ctx, s.d.claimPlan); err != nil {
			return nil, errors.Join(fmt.Errorf("sqlstore: claim: planner settings: %w", err), rollback(tx))
		}
	}
	return tx, nil
}

// leaseClaimed leases out, the rows a claim's transaction tx locked, to
// req.Owner and commits tx. The caller rolls tx back on an error.
func (s *Store) leaseClaimed(ctx context.Context, tx *sqlx.Tx, req driver.ClaimRequest, out []driver.Row) ([]driver.Row, error) {
	if len(out) == 0 {
		return nil, tx.Commit()
	}
	ids := make([]string, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	q := s.leaseSQL(len(ids))
	if _, err := tx.ExecContext(ctx, q, s.idArgs(ids, req.Owner, req.Lease.Microseconds())...); err != nil {
		return nil, fmt.Errorf("sqlstore: claim: lease: %w", err)
	}
	if err := tx.Commit(); err != nil {
		// A COMMIT that failed on the way back (a cancelled context, a
		// dropped connection) may still have succeeded on the server: hand
		// the rows back, so that they are not leased to an instance that
		// never saw them.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := s.Release(rctx, req.Owner, ids, 0); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release after a failed commit: %w", rerr))
		}
		return nil, fmt.Errorf("sqlstore: claim: commit: %w", err)
	}
	return out, nil
}

// findRows is selectRows for the plain reads of a claim that finds first:
// q selects the id (and with at, the available_at) of each row, on the
// database, outside any transaction, limited on the server to ctx's
// deadline (see bounded). The rows carry their id alone.
func (s *Store) findRows(ctx context.Context, out []driver.Row, at bool, q string, args ...any) (_ []driver.Row, last any, _ error) {
	if limit := args[len(args)-1].(int); limit <= 0 {
		return out, nil, nil
	}
	rs, err := s.db.QueryContext(ctx, s.bounded(ctx, q), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlstore: claim: find: %w", err)
	}
	out = slices.Grow(out, args[len(args)-1].(int))
	dest := []any{nil, &last}
	for rs.Next() {
		var id string
		dest[0] = &id
		if !at {
			dest = dest[:1]
		}
		if err := rs.Scan(dest...); err != nil {
			rs.Close()
			return nil, nil, fmt.Errorf("sqlstore: claim: find: %w", err)
		}
		out = append(out, driver.Row{ID: id})
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, nil, fmt.Errorf("sqlstore: claim: find: %w", err)
	}
	return out, last, nil
}

// withArgs returns a claim SELECT's arguments: those before its type
// filter, the filter's, then limit.
func withArgs(types []any, limit int, before ...any) []any {
	return append(append(before, types...), limit)
}

// selector runs one of a claim's SELECTs (claimSet), appending its rows to out; with at, each row carries its
// available_at too, and the last one is returned.
type selector func(out []driver.Row, at bool, q string, args ...any) ([]driver.Row, any, error)

// claimCursor is where an owner's last full claim of NEW rows ended: the
// available_at (as the driver returned it, bound back as is) and id of its
// last row. The next claim resumes after it instead of at the front of the
// (status, available_at) index, which on InnoDB is cluttered with the
// delete-marked entries of rows delivered since its purge last ran.
//
// Rows before the cursor that become due later (a lease that expired, a
// row handed back, a replay, a row whose transaction committed late) are
// found by a claim from the front: one runs whenever a resumed claim comes
// back short (the backlog is exhausted, and the cursor is dropped), and
// every frontEvery-th claim in any case, so that a long backlog delays
// them by at most a few batches.
type claimCursor struct {
	at      any
	id      string
	resumed int // claims resumed since the last one from the front
}

const frontEvery = 16

// claimNewRows appends to out the NEW rows of a claim, up to req.Limit
// rows in all.
func (s *Store) claimNewRows(sel selector, out []driver.Row, req driver.ClaimRequest) ([]driver.Row, error) {
	want := req.Limit - len(out)
	if want <= 0 {
		return out, nil
	}
	skip := max(0, req.SkipRecent.Microseconds())
	cs, targs := s.claimSetFor(req)
	if !s.d.claimCursor {
		out, _, err := sel(out, true, cs.new, withArgs(targs, want, skip)...)
		return out, err
	}
	s.mu.Lock()
	cur, ok := s.cursors[req.Owner]
	s.mu.Unlock()
	n := len(out)
	var last any
	var err error
	if ok && cur.resumed < frontEvery {
		out, last, err = sel(out, true, cs.newAfter, withArgs(targs, want, cur.at, cur.at, cur.id, skip)...)
		if err != nil {
			return nil, err
		}
		cur.resumed++
		if got := len(out) - n; got < want {
			// The end of the backlog: the rest from the front, which holds
			// what became due behind the cursor. Rows this claim already
			// locked come back from it too (a transaction does not skip its
			// own locks) and are dropped.
			seen := make(map[string]bool, got)
			for _, r := range out[n:] {
				seen[r.ID] = true
			}
			more, _, err := sel(nil, true, cs.new, withArgs(targs, want-got, skip)...)
			if err != nil {
				return nil, err
			}
			for _, r := range more {
				if !seen[r.ID] {
					out = append(out, r)
				}
			}
			ok, last = false, nil
		}
	} else {
		out, last, err = sel(out, true, cs.new, withArgs(targs, want, skip)...)
		if err != nil {
			return nil, err
		}
		ok, cur = len(out)-n == want, claimCursor{}
	}
	s.mu.Lock()
	if ok && last != nil {
		cur.at, cur.id = last, out[len(out)-1].ID
		s.cursors[req.Owner] = cur
	} else {
		delete(s.cursors, req.Owner)
	}
	s.mu.Unlock()
	return out, nil
}

// selectRows appends the rows of a claim SELECT to out. With at, each row
// carries one more column, its available_at, and the last one is returned.
func selectRows(ctx context.Context, tx *sqlx.Tx, out []driver.Row, at bool, q string, args ...any) (_ []driver.Row, last any, _ error) {
	if limit := args[len(args)-1].(int); limit <= 0 {
		return out, nil, nil
	}
	rs, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlstore: claim: select: %w", err)
	}
	var extra []any
	if at {
		extra = []any{&last}
	}
	for rs.Next() {
		r, err := scanRow(rs, extra...)
		if err != nil {
			rs.Close()
			return nil, nil, fmt.Errorf("sqlstore: claim: scan: %w", err)
		}
		out = append(out, r)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, nil, fmt.Errorf("sqlstore: claim: select: %w", err)
	}
	return out, last, nil
}
