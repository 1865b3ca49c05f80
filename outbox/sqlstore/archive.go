package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Archive mode (Options.ArchiveDelivered): every write that completes an
// event (MarkDone, MarkDoneKeys, the last delivery of a split event in
// CompleteDeliveries or DeliverInTx) moves the event's row into
// <table>_archive instead of updating it to DONE, in the one transaction
// of that write: an event is in the table or in the archive, never in
// both or neither. The delivery records and attempt history of a split
// event stay beside the archive (Inspect shows them) until
// CleanupArchive removes the archived event.

var _ driver.Archiver = (*Store)(nil)

// ArchiveTable returns the quoted name of the archive table: the outbox
// table's name with "_archive" appended. Migrate creates it (whether or
// not Options.ArchiveDelivered is set: it costs an empty table).
func (s *Store) ArchiveTable() string { return s.suffixed("_archive") }

// archiveColumns are the columns an archived row is written with: the
// event table's, then delivered_at and delivered_by.
const archiveColumns = "id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at, done_at, locked_by, locked_until, last_error, ordering_key, key_seq, delivered_at, delivered_by"

// archiveSelect is the SELECT list that makes an event row an archived
// one, as the UPDATE to DONE would leave it (status DONE, done now, no
// lease), delivered at now by the one parameter it takes.
func archiveSelect(now string) string {
	return `id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, 1, attempts, available_at, created_at, ` + now + `, NULL, NULL, last_error, ordering_key, key_seq, ` + now + `, ?`
}

// archiveExec is what archiveWhere writes through: *sql.Tx (DeliverInTx)
// and *sqlx.Tx both are one.
type archiveExec interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// archiveWhere moves the events of the table that match where (a
// condition, unbound, whose parameters are args) into the archive as
// delivered by owner, through tx, and returns how many it moved: the
// count of the DELETE, which is the count archived. tx must be a
// transaction (READ COMMITTED where the dialect has it): the copy and the
// delete must commit together. Each dialect makes sure that the rows
// copied are exactly the rows deleted, whatever commits between its
// statements:
//
//   - PostgreSQL: one statement, a DELETE … RETURNING whose rows the
//     INSERT of the same statement writes. Only the DELETE reads the
//     table, so the condition (fences included) is decided once, on the
//     rows it deletes.
//   - SQLite: INSERT … SELECT, then DELETE, both with where. The
//     transaction holds the database's one write lock from its start
//     (SQLiteDSN's immediate transactions), so nothing changes between
//     the two and they see the same rows.
//   - MySQL/MariaDB: a locking read (SELECT id … FOR UPDATE) decides the
//     condition, fences included, once, on the latest version of each row,
//     and locks the rows it returns; the INSERT … SELECT and the DELETE then
//     name those rows by id. Re-deciding the condition in each statement
//     would not do at READ COMMITTED: a row could match the DELETE that did
//     not match the INSERT's read (the registry version, which is not
//     locked, could move between them; a lease could be taken anew), and
//     an event would be deleted unarchived. InnoDB's INSERT … SELECT reads
//     without locks at READ COMMITTED, and MySQL 8 has no DELETE …
//     RETURNING.
func (s *Store) archiveWhere(ctx context.Context, tx archiveExec, owner, where string, args []any) (int, error) {
	insert := `INSERT INTO ` + s.ArchiveTable() + ` (` + archiveColumns + `)`
	switch s.d.name {
	case "postgres":
		q := `WITH gone AS (DELETE FROM ` + s.table + ` WHERE ` + where + ` RETURNING *), at AS (SELECT ` + s.d.now + ` AS now)
` + insert + ` SELECT ` + archiveSelect("at.now") + ` FROM gone, at`
		return execN(ctx, tx, s.rebind(q), append(args[:len(args):len(args)], owner)...) // the owner's parameter comes last
	case "mysql":
		ids, err := s.lockArchived(ctx, tx, where, args)
		if err != nil || len(ids) == 0 {
			return 0, err
		}
		byID := ` WHERE id IN ` + in(len(ids))
		if _, err := tx.ExecContext(ctx, insert+` SELECT `+archiveSelect(s.d.now)+` FROM `+s.table+s.d.byID+byID, stringArgs(ids, owner)...); err != nil {
			return 0, fmt.Errorf("archive: %w", s.explainArchive(err))
		}
		return execN(ctx, tx, `DELETE FROM `+s.table+byID, stringArgs(ids)...)
	default:
		if _, err := tx.ExecContext(ctx, s.rebind(insert+` SELECT `+archiveSelect(s.d.now)+` FROM `+s.table+` WHERE `+where), append([]any{owner}, args...)...); err != nil {
			return 0, fmt.Errorf("archive: %w", s.explainArchive(err))
		}
		return execN(ctx, tx, s.rebind(`DELETE FROM `+s.table+` WHERE `+where), args...)
	}
}

// lockArchived is MySQL's locking read of archiveWhere: the ids of the
// rows that match where, locked until tx ends.
func (s *Store) lockArchived(ctx context.Context, tx archiveExec, where string, args []any) ([]string, error) {
	return readIDs(ctx, tx, `SELECT id FROM `+s.table+s.d.byID+` WHERE `+where+` FOR UPDATE`, args...)
}

// readIDs runs q through tx and returns the ids it reads.
func readIDs(ctx context.Context, tx archiveExec, q string, args ...any) ([]string, error) {
	rs, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	var ids []string
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			rs.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, errors.Join(rs.Err(), rs.Close())
}

func execN(ctx context.Context, tx archiveExec, q string, args ...any) (int, error) {
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// explainArchive adds what to do to an error of the archive table.
func (s *Store) explainArchive(err error) error {
	if err != nil && s.d.missingTable(err) {
		return fmt.Errorf("%w (the archive table %s of migration 007 does not exist: call Store.Migrate at start, or apply migrations/%s/007_archive.sql)", err, s.ArchiveTable(), s.d.name)
	}
	return err
}

// archiveDone is markDoneIn in archive mode: it archives ids, leased to
// owner, if the registry's version is registry, in tx.
func (s *Store) archiveDone(ctx context.Context, tx archiveExec, owner string, ids []string, registry int64) (int, error) {
	where := `locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2) AND id` + s.idIn(len(ids)) + s.regFence()
	return s.archiveWhere(ctx, tx, owner, where, append(s.idArgs(ids, owner), registry))
}

// archiveFinished archives, through tx, those of the split events ids
// (status 4) none of whose deliveries is left to do, as delivered by
// owner (the instance that completed the last one).
func (s *Store) archiveFinished(ctx context.Context, tx archiveExec, owner string, ids []string) error {
	where := `status = 4 AND id IN ` + in(len(ids)) + ` AND id NOT IN (SELECT event_id FROM ` + s.DeliveriesTable() + ` WHERE status <> 1 AND event_id IN ` + in(len(ids)) + `)`
	_, err := s.archiveWhere(ctx, tx, owner, where, append(stringArgs(ids), stringArgs(ids)...))
	return err
}

// DefaultArchiveSearchLimit is the most events SearchArchive returns
// when ArchiveQuery.Limit is 0; MaxArchiveSearchLimit the most it
// returns at all.
const (
	DefaultArchiveSearchLimit = 100
	MaxArchiveSearchLimit     = 1000
)

// SearchArchive implements driver.Archiver: the archived events that
// match q, by id (then by when they were delivered: an id that
// PublishOnce reused after its first event was archived is archived
// twice), up to q.Limit. Each field of q is a condition on an index of
// the archive: the primary key (id), (event_type, id) or
// (aggregate_type, aggregate_id, id).
func (s *Store) SearchArchive(ctx context.Context, q driver.ArchiveQuery) ([]driver.ArchivedEvent, error) {
	if q.Limit < 0 || q.Limit > MaxArchiveSearchLimit {
		return nil, fmt.Errorf("sqlstore: search the archive: limit %d; it must be 1 to %d, or 0 for %d", q.Limit, MaxArchiveSearchLimit, DefaultArchiveSearchLimit)
	}
	if q.AggregateID != "" && q.AggregateType == "" {
		return nil, errors.New("sqlstore: search the archive: an aggregate id needs its aggregate type")
	}
	var conds []string
	var args []any
	for _, c := range []struct{ col, v string }{{"id", q.ID}, {"event_type", q.Type}, {"aggregate_type", q.AggregateType}, {"aggregate_id", q.AggregateID}} {
		if c.v != "" {
			conds = append(conds, c.col+` = ?`)
			args = append(args, c.v)
		}
	}
	if q.After != "" {
		conds = append(conds, `id > ?`)
		args = append(args, q.After)
	}
	where := ""
	if len(conds) > 0 {
		where = ` WHERE ` + strings.Join(conds, ` AND `)
	}
	query := s.rebind(`SELECT id, event_type, aggregate_type, aggregate_id, tenant_id, COALESCE(ordering_key, ''), attempts, created_at, delivered_at, delivered_by FROM ` + s.ArchiveTable() + where + ` ORDER BY id, delivered_at LIMIT ?`)
	rs, err := s.db.QueryContext(ctx, query, append(args, cmpOr(q.Limit, DefaultArchiveSearchLimit))...)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: search the archive: %w", s.explainArchive(err))
	}
	defer rs.Close()
	var out []driver.ArchivedEvent
	for rs.Next() {
		var e driver.ArchivedEvent
		var created, delivered dbTime
		if err := rs.Scan(&e.ID, &e.Type, &e.AggregateType, &e.AggregateID, &e.TenantID, &e.OrderingKey, &e.Attempts, &created, &delivered, &e.DeliveredBy); err != nil {
			return nil, fmt.Errorf("sqlstore: search the archive: %w", err)
		}
		e.CreatedAt, e.DeliveredAt = created.Time, delivered.Time
		out = append(out, e)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("sqlstore: search the archive: %w", err)
	}
	return out, nil
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// CleanupArchive implements driver.Archiver. It reads the ids of up to
// limit events delivered before the cut-off (on the delivered_at index,
// oldest first), then deletes them by primary key, with the delivery
// records and attempt history kept for them: each call locks at most
// limit rows. The age is measured on the database's clock.
//
// On MySQL/MariaDB a partitioned archive (Partition) drops its old days
// whole instead (PartitionConfig.ArchiveRetention); this batched DELETE
// works on a partitioned archive too.
func (s *Store) CleanupArchive(ctx context.Context, olderThan time.Duration, limit int) (int64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("sqlstore: cleanup of the archive: limit %d; it must be positive", limit)
	}
	q := s.rebind(`SELECT id FROM ` + s.ArchiveTable() + ` WHERE delivered_at < ` + s.d.nowMinus + ` ORDER BY delivered_at LIMIT ?`)
	rs, err := s.db.QueryContext(ctx, q, max(0, olderThan).Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("sqlstore: cleanup of the archive: %w", s.explainArchive(err))
	}
	var ids []string
	for rs.Next() {
		var id string
		if err := rs.Scan(&id); err != nil {
			rs.Close()
			return 0, fmt.Errorf("sqlstore: cleanup of the archive: %w", err)
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return 0, fmt.Errorf("sqlstore: cleanup of the archive: %w", err)
	}
	var total int64
	for len(ids) > 0 {
		k := min(len(ids), 500)
		batch := ids[:k]
		ids = ids[k:]
		var n int
		// The cut-off again: a copy of an id delivered since (PublishOnce
		// reused it) is not old enough.
		del := s.rebind(`DELETE FROM ` + s.ArchiveTable() + ` WHERE id` + s.idIn(k) + ` AND delivered_at < ` + s.d.nowMinus)
		err := s.inTx(ctx, func(tx *sqlx.Tx) error {
			var err error
			if n, err = execN(ctx, tx, del, append(s.idArgs(batch), max(0, olderThan).Microseconds())...); err != nil {
				return err
			}
			return s.dropArchivedRecords(ctx, tx, batch)
		})
		total += int64(n)
		if err != nil {
			return total, fmt.Errorf("sqlstore: cleanup of the archive: %w", err)
		}
	}
	return total, nil
}

// dropArchivedRecords deletes the delivery records and attempt history
// of ids, archived events just deleted from the archive, unless the
// event table holds an event of the id again (PublishOnce after the
// archive) or the archive another copy.
func (s *Store) dropArchivedRecords(ctx context.Context, tx archiveExec, ids []string) error {
	for _, t := range []string{s.DeliveriesTable(), s.AttemptsTable()} {
		q := s.rebind(`DELETE FROM ` + t + ` WHERE event_id IN ` + in(len(ids)) + ` AND event_id NOT IN (SELECT id FROM ` + s.table + ` WHERE id IN ` + in(len(ids)) + `)
  AND event_id NOT IN (SELECT id FROM ` + s.ArchiveTable() + ` WHERE id IN ` + in(len(ids)) + `)`)
		if _, err := tx.ExecContext(ctx, q, append(append(stringArgs(ids), stringArgs(ids)...), stringArgs(ids)...)...); err != nil {
			return fmt.Errorf("delete from %s: %w", t, s.explainSubs(err))
		}
	}
	return nil
}

// inspectArchived is Inspect of an event not in the table: its latest
// copy in the archive, with the delivery records kept for it.
func (s *Store) inspectArchived(ctx context.Context, id string) (outbox.Record, error) {
	var rec outbox.Record
	var at dbTime
	q := s.rebind(`SELECT ` + rowColumns + `, COALESCE(last_error, ''), delivered_at, delivered_by FROM ` + s.ArchiveTable() + ` WHERE id = ? ORDER BY delivered_at DESC LIMIT 1`)
	r, err := scanRow(s.db.QueryRowContext(ctx, q, id), &rec.LastError, &at, &rec.DeliveredBy)
	if errors.Is(err, sql.ErrNoRows) || s.d.missingTable(err) {
		return rec, outbox.ErrNotFound
	}
	if err != nil {
		return rec, fmt.Errorf("sqlstore: inspect %s in the archive: %w", id, err)
	}
	rec.Row, rec.DeliveredAt = r, at.Time
	rec.PrevOwner = ""
	if rec.Deliveries, err = s.inspectDeliveries(ctx, id); err != nil {
		return rec, fmt.Errorf("sqlstore: inspect %s in the archive: %w", id, err)
	}
	return rec, nil
}
