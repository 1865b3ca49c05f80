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

// The claim: one short transaction that leases due rows to an instance.

// Claim implements driver.Store: one short transaction (READ COMMITTED on
// MySQL and PostgreSQL, so it does not block concurrent inserts) selects
// due rows with FOR UPDATE SKIP LOCKED and leases them to req.Owner.
// Deadlocks and lock-wait timeouts are retried.
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
	opts := &sql.TxOptions{}
	if s.d.readCommitted {
		opts.Isolation = sql.LevelReadCommitted
	}
	tx, err := s.db.BeginTxx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim: begin: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, rollback(tx))
		}
	}()
	// Due retries first, up to a quarter of the batch so that a backlog of
	// new events cannot starve them, then new events for the rest.
	out, err := selectRows(ctx, tx, nil, s.q.claimRetry, max(1, req.Limit/4))
	if err != nil {
		return nil, err
	}
	if out, err = selectRows(ctx, tx, out, s.q.claimNew, max(0, req.SkipRecent.Microseconds()), req.Limit-len(out)); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, tx.Commit()
	}
	ids := make([]string, len(out))
	for i := range out {
		ids[i] = out[i].ID
	}
	q := s.leaseSQL(len(ids))
	if _, err := tx.ExecContext(ctx, q, stringArgs(ids, req.Owner, req.Lease.Microseconds())...); err != nil {
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

// selectRows appends the rows of a claim SELECT to out.
func selectRows(ctx context.Context, tx *sqlx.Tx, out []driver.Row, q string, args ...any) ([]driver.Row, error) {
	if limit := args[len(args)-1].(int); limit <= 0 {
		return out, nil
	}
	rs, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: claim: select: %w", err)
	}
	for rs.Next() {
		r, err := scanRow(rs)
		if err != nil {
			rs.Close()
			return nil, fmt.Errorf("sqlstore: claim: scan: %w", err)
		}
		out = append(out, r)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, fmt.Errorf("sqlstore: claim: select: %w", err)
	}
	return out, nil
}
