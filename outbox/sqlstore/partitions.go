package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// MySQL and MariaDB only: the outbox table can be partitioned by the day
// its rows were created (RANGE COLUMNS on created_at, one partition per
// UTC day, named pYYYYMMDD, and a tail partition pmax for anything beyond
// the last day). Delivered events are then removed by dropping a whole
// day at once, which costs the database almost nothing, instead of
// deleting them row by row (Config.Retention).
//
// A partitioned table's primary key is (id, created_at): MySQL requires
// the partitioning column in every unique key. The database no longer
// refuses a second event with the same id; the engine's ids are ULIDs and
// never repeat, but an application that chooses its own ids must not
// reuse them.

// PartitionConfig says which partitions MaintainPartitions keeps.
type PartitionConfig struct {
	// Ahead is the number of days after today (UTC) that get their own
	// partition in advance. Defaults to 7.
	Ahead int
	// Retention is how long a day's partition is kept after the day
	// ended; 0 keeps every partition. A partition past it is dropped only
	// if it holds no undelivered event (NEW, RETRY, or split with a
	// delivery still pending) and, unless DropDead, no dead one.
	Retention time.Duration
	// DropDead lets a partition with dead events be dropped (their dead
	// letters are lost).
	DropDead bool
	// ArchiveRetention is how long a day's partition of the archive
	// (Options.ArchiveDelivered) is kept after the day ended, by the day
	// its events were delivered; 0 keeps every one. Every archived event
	// is delivered: a day past it is dropped whole, with the delivery
	// records and attempt history kept for its events. It is the
	// partitioned form of outbox.Config.ArchiveRetention (a batched
	// DELETE): set one of them.
	ArchiveRetention time.Duration
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

// Partition is one partition of the outbox table.
type Partition struct {
	Name string
	// Before is the exclusive upper bound of its created_at (UTC); zero
	// for pmax.
	Before time.Time
	// Rows is the database's estimate of its rows (information_schema).
	Rows int64
}

// PartitionResult is what MaintainPartitions did.
type PartitionResult struct {
	Added, Dropped []string
	// Kept are partitions past retention that still hold undelivered (or
	// dead) events, with the count that kept them.
	Kept map[string]int64
	// ArchiveAdded and ArchiveDropped are the archive's partitions
	// added and dropped (none if the archive is not partitioned).
	ArchiveAdded, ArchiveDropped []string
	// Busy reports that another session held the maintenance lock:
	// nothing was done.
	Busy bool
}

// ErrNotPartitionable is returned by the partition methods for a
// database other than MySQL or MariaDB.
var ErrNotPartitionable = errors.New("sqlstore: partitions: only MySQL and MariaDB tables can be partitioned (use Config.Retention on PostgreSQL and SQLite)")

// ErrInboxTable is returned by Partition for an inbox table (package
// inbox): it is never partitioned.
var ErrInboxTable = errors.New("sqlstore: partition: an inbox table (package inbox) is never partitioned: its primary key (consumer, message_id) is the dedupe, and MySQL and MariaDB require the partitioning column in every unique key, so a table partitioned by time would take a redelivery for a new message and apply it twice; partition the outbox table (Options.Table without the _inbox suffix) and leave the inbox's retention to inbox.Cleanup, a batched DELETE on its (status, received_at) index (docs/inbox.md, Retention)")

const pmax = "pmax"

func (s *Store) schemaAndName() (schema, name string) { return splitTable(s.table) }

// splitTable splits a quoted, possibly schema-qualified table name into
// its schema ("" for the connection's) and its name.
func splitTable(table string) (schema, name string) {
	t := strings.ReplaceAll(table, "`", "")
	if i := strings.IndexByte(t, '.'); i >= 0 {
		return t[:i], t[i+1:]
	}
	return "", t
}

// Partitions lists the table's partitions, oldest first (pmax last); none
// if the table is not partitioned.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	return s.partitionsOf(ctx, s.table)
}

// ArchivePartitions lists the archive's partitions (Before bounds its
// delivered_at), oldest first (pmax last); none if the archive is not
// partitioned.
func (s *Store) ArchivePartitions(ctx context.Context) ([]Partition, error) {
	return s.partitionsOf(ctx, s.ArchiveTable())
}

func (s *Store) partitionsOf(ctx context.Context, table string) ([]Partition, error) {
	if s.d != MySQL {
		return nil, ErrNotPartitionable
	}
	schema, name := splitTable(table)
	q := `SELECT PARTITION_NAME, PARTITION_DESCRIPTION, TABLE_ROWS FROM information_schema.PARTITIONS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL
ORDER BY PARTITION_ORDINAL_POSITION`
	rows, err := s.db.QueryContext(ctx, q, schema, name)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: partitions of %s: %w", table, err)
	}
	defer rows.Close()
	var out []Partition
	for rows.Next() {
		var p Partition
		var desc sql.NullString
		var n sql.NullInt64
		if err := rows.Scan(&p.Name, &desc, &n); err != nil {
			return nil, fmt.Errorf("sqlstore: partitions of %s: %w", table, err)
		}
		p.Rows = n.Int64
		if p.Name != pmax {
			d := strings.Trim(desc.String, "'")
			if t, err := time.Parse("2006-01-02", d[:min(10, len(d))]); err == nil {
				p.Before = t
			}
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

func dayName(day time.Time) string { return "p" + day.Format("20060102") }

func dayBound(day time.Time) string { return day.AddDate(0, 0, 1).Format("2006-01-02") }

// Partition turns the outbox table into a table partitioned by day, with
// partitions from the day of its oldest row to Ahead days from today and
// pmax; rows are kept. The archive (ArchiveTable) is partitioned the same
// way, by the day its events were delivered (delivered_at), so that
// MaintainPartitions can drop its old days too (ArchiveRetention). It
// does nothing to a table partitioned already. Converting copies the
// table: on a large table, run it in a quiet hour (or create the table
// partitioned before it fills).
func (s *Store) Partition(ctx context.Context, cfg PartitionConfig) error {
	if s.d != MySQL {
		return ErrNotPartitionable
	}
	if err := s.refuseInbox(ctx); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	if err := s.partitionByDay(ctx, s.table, "created_at", " DROP PRIMARY KEY, ADD PRIMARY KEY (id, created_at)", cfg); err != nil {
		return err
	}
	// The archive's primary key holds delivered_at already (migration
	// 007). A store migrated before it has no archive: nothing to do.
	if ok, err := s.tableExists(ctx, s.ArchiveTable()); err != nil || !ok {
		return err
	}
	return s.partitionByDay(ctx, s.ArchiveTable(), "delivered_at", "", cfg)
}

// partitionByDay partitions table by RANGE COLUMNS(col), one partition a
// UTC day from the day of its oldest row to Ahead days from today, and
// pmax; alter is what the ALTER TABLE does before (the primary key must
// hold col). Nothing is done if table is partitioned already.
func (s *Store) partitionByDay(ctx context.Context, table, col, alter string, cfg PartitionConfig) error {
	parts, err := s.partitionsOf(ctx, table)
	if err != nil || len(parts) > 0 {
		return err
	}
	today := cfg.Now().UTC().Truncate(24 * time.Hour)
	first := today
	var oldest sql.NullTime
	if err := s.db.QueryRowContext(ctx, `SELECT MIN(`+col+`) FROM `+table).Scan(&oldest); err != nil {
		return fmt.Errorf("sqlstore: partition %s: %w", table, err)
	}
	if oldest.Valid && oldest.Time.Before(first) {
		first = oldest.Time.UTC().Truncate(24 * time.Hour)
	}
	var defs []string
	for day := first; !day.After(today.AddDate(0, 0, cfg.Ahead)); day = day.AddDate(0, 0, 1) {
		defs = append(defs, fmt.Sprintf("PARTITION %s VALUES LESS THAN ('%s')", dayName(day), dayBound(day)))
	}
	defs = append(defs, "PARTITION pmax VALUES LESS THAN (MAXVALUE)")
	stmt := `ALTER TABLE ` + table + alter + `
PARTITION BY RANGE COLUMNS(` + col + `) (` + strings.Join(defs, ", ") + `)`
	if _, err := s.db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("sqlstore: partition %s: %w", table, err)
	}
	return nil
}

// tableExists reports whether the quoted table exists.
func (s *Store) tableExists(ctx context.Context, table string) (bool, error) {
	schema, name := splitTable(table)
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ?`, schema, name).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("sqlstore: does %s exist: %w", table, err)
	}
	return n > 0, nil
}

// refuseInbox returns ErrInboxTable if the table is an inbox table (it
// has the inbox's key columns).
func (s *Store) refuseInbox(ctx context.Context) error {
	schema, name := s.schemaAndName()
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME IN ('consumer', 'message_id')`, schema, name).Scan(&n)
	if err != nil {
		return fmt.Errorf("sqlstore: partition: %w", err)
	}
	if n == 2 {
		return fmt.Errorf("%w (table %s)", ErrInboxTable, s.table)
	}
	return nil
}

func (c PartitionConfig) withDefaults() PartitionConfig {
	if c.Ahead <= 0 {
		c.Ahead = 7
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// MaintainPartitions adds the partitions of the next Ahead days (by
// splitting pmax) and drops those whose day ended more than Retention
// ago, only when no undelivered event remains in them (their events'
// delivery rows go with them). If the archive is partitioned (Partition
// does it), it does the same there: the days ahead, and the days past
// ArchiveRetention dropped whole. One session at a time does it, under a
// named lock (GET_LOCK) of the table (see lockName); another finds it
// held and returns with Busy set.
// Run it daily or hourly from one place or every instance alike.
func (s *Store) MaintainPartitions(ctx context.Context, cfg PartitionConfig) (PartitionResult, error) {
	var res PartitionResult
	if s.d != MySQL {
		return res, ErrNotPartitionable
	}
	cfg = cfg.withDefaults()
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return res, fmt.Errorf("sqlstore: maintain partitions: %w", err)
	}
	defer conn.Close()
	lock, err := s.lockName(ctx, conn, "txoutbox_partitions_")
	if err != nil {
		return res, fmt.Errorf("sqlstore: maintain partitions: %w", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&got); err != nil {
		return res, fmt.Errorf("sqlstore: maintain partitions: lock: %w", err)
	}
	if got.Int64 != 1 {
		res.Busy = true
		return res, nil
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT RELEASE_LOCK(?)", lock)

	parts, err := s.Partitions(ctx)
	if err != nil {
		return res, err
	}
	if len(parts) == 0 {
		return res, fmt.Errorf("sqlstore: maintain partitions: %s is not partitioned: call Store.Partition first (or outboxctl partitions maintain -create)", s.table)
	}
	if res.Added, err = s.addDays(ctx, conn, s.table, parts, cfg); err != nil {
		return res, err
	}
	if err := s.dropDays(ctx, conn, parts, cfg, &res); err != nil {
		return res, err
	}
	return res, s.maintainArchive(ctx, conn, cfg, &res)
}

// addDays adds to table, partitioned as parts, a partition for each day
// up to Ahead days from today that has none, by splitting pmax.
func (s *Store) addDays(ctx context.Context, conn *sqlx.Conn, table string, parts []Partition, cfg PartitionConfig) ([]string, error) {
	if parts[len(parts)-1].Name != pmax {
		return nil, fmt.Errorf("sqlstore: maintain partitions: %s has no %s partition; add one: ALTER TABLE %s ADD PARTITION (PARTITION pmax VALUES LESS THAN (MAXVALUE))", table, pmax, table)
	}
	today := cfg.Now().UTC().Truncate(24 * time.Hour)
	last := today.AddDate(0, 0, -1)
	for _, p := range parts {
		if !p.Before.IsZero() && p.Before.AddDate(0, 0, -1).After(last) {
			last = p.Before.AddDate(0, 0, -1)
		}
	}
	var defs, added []string
	for day := last.AddDate(0, 0, 1); !day.After(today.AddDate(0, 0, cfg.Ahead)); day = day.AddDate(0, 0, 1) {
		defs = append(defs, fmt.Sprintf("PARTITION %s VALUES LESS THAN ('%s')", dayName(day), dayBound(day)))
		added = append(added, dayName(day))
	}
	if len(defs) == 0 {
		return nil, nil
	}
	stmt := `ALTER TABLE ` + table + ` REORGANIZE PARTITION pmax INTO (` + strings.Join(defs, ", ") + `, PARTITION pmax VALUES LESS THAN (MAXVALUE))`
	if _, err := conn.ExecContext(ctx, stmt); err != nil {
		return nil, fmt.Errorf("sqlstore: maintain partitions: add %v to %s: %w", added, table, err)
	}
	return added, nil
}

// pastDays returns the day partitions of parts whose day ended more than
// retention ago (none if retention is 0).
func pastDays(parts []Partition, retention time.Duration, now time.Time) []string {
	if retention <= 0 {
		return nil
	}
	cutoff := now.UTC().Add(-retention)
	var out []string
	for _, p := range parts {
		if p.Name != pmax && !p.Before.IsZero() && !p.Before.After(cutoff) {
			out = append(out, p.Name)
		}
	}
	return out
}

// dropDays drops the event table's days past Retention that hold nothing
// undelivered (nor dead, unless DropDead).
func (s *Store) dropDays(ctx context.Context, conn *sqlx.Conn, parts []Partition, cfg PartitionConfig, res *PartitionResult) error {
	for _, p := range pastDays(parts, cfg.Retention, cfg.Now()) {
		held, err := s.heldIn(ctx, conn, p, cfg.DropDead)
		if err != nil {
			return err
		}
		if held > 0 {
			if res.Kept == nil {
				res.Kept = map[string]int64{}
			}
			res.Kept[p] = held
			continue
		}
		if err := s.dropPartition(ctx, conn, p); err != nil {
			return err
		}
		res.Dropped = append(res.Dropped, p)
	}
	return nil
}

// maintainArchive adds the archive's days ahead and drops its days past
// ArchiveRetention, if the archive is partitioned.
func (s *Store) maintainArchive(ctx context.Context, conn *sqlx.Conn, cfg PartitionConfig, res *PartitionResult) error {
	parts, err := s.ArchivePartitions(ctx)
	if err != nil || len(parts) == 0 {
		return err
	}
	if res.ArchiveAdded, err = s.addDays(ctx, conn, s.ArchiveTable(), parts, cfg); err != nil {
		return err
	}
	for _, p := range pastDays(parts, cfg.ArchiveRetention, cfg.Now()) {
		if err := s.dropArchivePartition(ctx, conn, p); err != nil {
			return err
		}
		res.ArchiveDropped = append(res.ArchiveDropped, p)
	}
	return nil
}

// heldIn counts the events of partition p that must not be dropped:
// undelivered ones, split ones with a delivery still pending, and (unless
// dropDead) dead ones or split ones with a dead delivery.
func (s *Store) heldIn(ctx context.Context, conn *sqlx.Conn, p string, dropDead bool) (int64, error) {
	held := "0, 2"
	dstatus := "0, 2"
	if !dropDead {
		held += ", 3"
		dstatus += ", 3"
	}
	q := `SELECT COUNT(*) FROM ` + s.table + ` PARTITION (` + p + `) e WHERE e.status IN (` + held + `)
OR (e.status = 4 AND EXISTS (SELECT 1 FROM ` + s.DeliveriesTable() + ` d WHERE d.event_id = e.id AND d.status IN (` + dstatus + `)))`
	var n int64
	if err := conn.QueryRowContext(ctx, q).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlstore: maintain partitions: count what %s still holds: %w", p, err)
	}
	return n, nil
}

// dropPartition deletes the delivery rows and attempt history of the
// partition's events, then drops it.
func (s *Store) dropPartition(ctx context.Context, conn *sqlx.Conn, p string) error {
	for _, t := range []string{s.DeliveriesTable(), s.AttemptsTable()} {
		q := `DELETE x FROM ` + t + ` x JOIN ` + s.table + ` PARTITION (` + p + `) e ON x.event_id = e.id`
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("sqlstore: drop partition %s: delete from %s: %w", p, t, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `ALTER TABLE `+s.table+` DROP PARTITION `+p); err != nil {
		return fmt.Errorf("sqlstore: drop partition %s: %w", p, err)
	}
	return nil
}

// dropArchivePartition deletes the delivery records and attempt history
// kept for the archived events of partition p (unless the event table
// holds an event of the id again, or a later day of the archive another
// copy: PublishOnce after the archive), then drops it.
func (s *Store) dropArchivePartition(ctx context.Context, conn *sqlx.Conn, p string) error {
	a := s.ArchiveTable()
	for _, t := range []string{s.DeliveriesTable(), s.AttemptsTable()} {
		q := `DELETE x FROM ` + t + ` x JOIN ` + a + ` PARTITION (` + p + `) o ON x.event_id = o.id
WHERE NOT EXISTS (SELECT 1 FROM ` + s.table + ` e WHERE e.id = x.event_id)
  AND NOT EXISTS (SELECT 1 FROM ` + a + ` n WHERE n.id = x.event_id AND n.delivered_at > o.delivered_at)`
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("sqlstore: drop archive partition %s: delete from %s: %w", p, t, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `ALTER TABLE `+a+` DROP PARTITION `+p); err != nil {
		return fmt.Errorf("sqlstore: drop archive partition %s: %w", p, err)
	}
	return nil
}

// RunPartitionMaintainer calls MaintainPartitions at once and then every
// interval until ctx ends, logging what it did; errors are logged and
// tried again at the next interval. Every instance may run it: the lock
// lets one at a time work.
func (s *Store) RunPartitionMaintainer(ctx context.Context, interval time.Duration, cfg PartitionConfig, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := s.MaintainPartitions(ctx, cfg)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("maintain the outbox partitions", slog.Any("error", err))
		case len(res.Added)+len(res.Dropped)+len(res.Kept)+len(res.ArchiveAdded)+len(res.ArchiveDropped) > 0:
			kept := make([]string, 0, len(res.Kept))
			for p := range res.Kept {
				kept = append(kept, p)
			}
			slices.Sort(kept)
			log.Info("outbox partitions maintained", slog.Any("added", res.Added), slog.Any("dropped", res.Dropped), slog.Any("kept_undelivered", kept),
				slog.Any("archive_added", res.ArchiveAdded), slog.Any("archive_dropped", res.ArchiveDropped))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
