package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// splitClaimStore is sqlstore's MySQL store with one change, for the
// drain experiment: Claim selects NEW and RETRY rows in two index-ordered
// SELECTs joined by UNION ALL instead of one `status IN (0, 2)` SELECT,
// whose ORDER BY MariaDB can only satisfy by sorting every due row.
type splitClaimStore struct {
	*sqlstore.Store
	db *sqlx.DB
}

const splitClaimPart = `(SELECT id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, created_at, locked_by
 FROM %[1]s WHERE status = %[2]d AND available_at <= UTC_TIMESTAMP(6)
  AND (locked_until IS NULL OR locked_until <= UTC_TIMESTAMP(6)) AND created_at <= (UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)
 ORDER BY available_at LIMIT ? FOR UPDATE SKIP LOCKED)`

func (s *splitClaimStore) Claim(ctx context.Context, req driver.ClaimRequest) (_ []driver.Row, err error) {
	if req.Limit <= 0 {
		return nil, nil
	}
	t := s.Table()
	q := fmt.Sprintf(splitClaimPart, t, 0) + " UNION ALL " + fmt.Sprintf(splitClaimPart, t, 2)
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	skip := max(0, req.SkipRecent.Microseconds())
	rs, err := tx.QueryContext(ctx, q, skip, req.Limit, skip, req.Limit)
	if err != nil {
		return nil, fmt.Errorf("harness: split claim: %w", err)
	}
	var out []driver.Row
	for rs.Next() {
		var r driver.Row
		var owner sql.NullString
		var status int
		if err := rs.Scan(&r.ID, &r.Type, &r.AggregateType, &r.AggregateID, &r.TenantID, &r.Headers, &r.Payload,
			&r.PayloadJSON, &r.OccurredAt, &status, &r.Attempts, &r.CreatedAt, &owner); err != nil {
			rs.Close()
			return nil, err
		}
		r.Status, r.PrevOwner = outbox.Status(status), owner.String
		out = append(out, r)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, err
	}
	if len(out) > req.Limit {
		out = out[:req.Limit] // NEW first; the RETRY rows stay locked only until commit
	}
	if len(out) == 0 {
		return nil, tx.Commit()
	}
	args := []any{req.Owner, req.Lease.Microseconds()}
	for _, r := range out {
		args = append(args, r.ID)
	}
	upd := `UPDATE ` + t + ` SET locked_by = ?, locked_until = (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) WHERE id IN (` +
		strings.TrimSuffix(strings.Repeat("?, ", len(out)), ", ") + `)`
	if _, err := tx.ExecContext(ctx, upd, args...); err != nil {
		return nil, err
	}
	return out, tx.Commit()
}
