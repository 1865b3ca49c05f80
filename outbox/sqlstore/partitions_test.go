package sqlstore_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func partitionNames(t *testing.T, s *sqlstore.Store) []string {
	t.Helper()
	ps, err := s.Partitions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	return names
}

func day(t time.Time, d int) string { return "p" + t.AddDate(0, 0, d).Format("20060102") }

// A populated table is partitioned by day with its rows kept; the
// maintainer adds the days ahead, keeps an old day that still holds an
// undelivered event, drops it (with its events' delivery rows) once
// everything in it is delivered, and steps aside while another session
// holds its lock.
func TestPartitionMaintenance(t *testing.T) {
	ctx := context.Background()
	db := testdb.MySQL(t)
	s := testdb.Store(t, db)
	ob, err := outbox.New(s, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	publish := func() string {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	old, oldDone, fresh := publish(), publish(), publish()
	// Two events three days old: one undelivered, one delivered with a
	// delivery row (as a split event leaves).
	if _, err := db.Exec(`UPDATE `+s.Table()+` SET created_at = created_at - INTERVAL 3 DAY WHERE id IN (?, ?)`, old, oldDone); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE `+s.Table()+` SET status = 1 WHERE id = ?`, oldDone); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO `+s.DeliveriesTable()+` (event_id, subscription, status, attempts, available_at, created_at) VALUES (?, 'x', 1, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`, oldDone); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(24 * time.Hour)
	if err := s.Partition(ctx, sqlstore.PartitionConfig{Ahead: 2}); err != nil {
		t.Fatal(err)
	}
	want := []string{day(now, -3), day(now, -2), day(now, -1), day(now, 0), day(now, 1), day(now, 2), "pmax"}
	if got := partitionNames(t, s); !slices.Equal(got, want) {
		t.Fatalf("partitions = %v; want %v", got, want)
	}
	if err := s.Partition(ctx, sqlstore.PartitionConfig{}); err != nil {
		t.Fatalf("Partition of a partitioned table: %v; want nothing done", err)
	}
	for _, id := range []string{old, oldDone, fresh} {
		if _, err := s.Inspect(ctx, id); err != nil {
			t.Fatalf("event %s after partitioning: %v", id, err)
		}
	}
	publish() // inserts still land (today's partition)

	// Two days later: two more days ahead; the old day is past a one-day
	// retention but holds an undelivered event.
	later := func() time.Time { return time.Now().AddDate(0, 0, 2) }
	cfg := sqlstore.PartitionConfig{Ahead: 2, Retention: 24 * time.Hour, Now: later}
	res, err := s.MaintainPartitions(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Added, []string{day(now, 3), day(now, 4)}) {
		t.Fatalf("added %v; want %v", res.Added, []string{day(now, 3), day(now, 4)})
	}
	if res.Kept[day(now, -3)] != 1 || slices.Contains(res.Dropped, day(now, -3)) {
		t.Fatalf("result %+v; want %s kept for its one undelivered event", res, day(now, -3))
	}
	if len(res.Dropped) != 2 || res.Dropped[0] != day(now, -2) {
		t.Fatalf("dropped %v; want the two empty days before yesterday-of-then", res.Dropped)
	}
	if _, err := s.Inspect(ctx, old); err != nil {
		t.Fatalf("undelivered event lost: %v", err)
	}

	if _, err := db.Exec(`UPDATE `+s.Table()+` SET status = 1 WHERE id = ?`, old); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lock := sqlstore.LockName(t, s, "txoutbox_partitions_")
	if _, err := conn.ExecContext(ctx, "SELECT GET_LOCK(?, 0)", lock); err != nil {
		t.Fatal(err)
	}
	if res, err := s.MaintainPartitions(ctx, cfg); err != nil || !res.Busy || len(res.Dropped) != 0 {
		t.Fatalf("with the lock held elsewhere: %+v, %v; want Busy and nothing done", res, err)
	}
	conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", lock)

	res, err = s.MaintainPartitions(ctx, cfg)
	if err != nil || !slices.Equal(res.Dropped, []string{day(now, -3)}) || len(res.Added) != 0 {
		t.Fatalf("after delivery: %+v, %v; want %s dropped, nothing added", res, err, day(now, -3))
	}
	if _, err := s.Inspect(ctx, old); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("event of a dropped day: %v; want ErrNotFound", err)
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM `+s.DeliveriesTable()+` WHERE event_id = ?`, oldDone); err != nil || n != 0 {
		t.Fatalf("delivery rows of a dropped day: %d, %v; want 0", n, err)
	}
	if _, err := s.Inspect(ctx, fresh); err != nil {
		t.Fatalf("today's event: %v", err)
	}
}

func TestPartitionsOnlyOnMySQL(t *testing.T) {
	s := testdb.Store(t, testdb.SQLite(t))
	if _, err := s.Partitions(context.Background()); !errors.Is(err, sqlstore.ErrNotPartitionable) {
		t.Fatalf("Partitions on SQLite: %v; want ErrNotPartitionable", err)
	}
	if _, err := s.MaintainPartitions(context.Background(), sqlstore.PartitionConfig{}); !errors.Is(err, sqlstore.ErrNotPartitionable) {
		t.Fatalf("MaintainPartitions on SQLite: %v", err)
	}
}

// Partitioning the outbox table leaves its inbox tables alone, and a
// store pointed at an inbox table refuses to partition it (its primary
// key is the dedupe; see ErrInboxTable).
func TestPartitionLeavesTheInboxAlone(t *testing.T) {
	ctx := context.Background()
	db := testdb.MySQL(t)
	s := testdb.Store(t, db)
	if err := s.Partition(ctx, sqlstore.PartitionConfig{}); err != nil {
		t.Fatal(err)
	}
	if len(partitionNames(t, s)) == 0 {
		t.Fatal("the outbox table is not partitioned")
	}
	inboxTable := strings.Trim(s.InboxTable(), "`")
	in, err := sqlstore.New(db, sqlstore.Options{Table: inboxTable})
	if err != nil {
		t.Fatal(err)
	}
	if ps := partitionNames(t, in); len(ps) != 0 {
		t.Errorf("the inbox table has partitions %v", ps)
	}
	err = in.Partition(ctx, sqlstore.PartitionConfig{})
	if !errors.Is(err, sqlstore.ErrInboxTable) || !strings.Contains(err.Error(), "inbox.Cleanup") {
		t.Fatalf("Partition of %s: %v; want ErrInboxTable", inboxTable, err)
	}
	if ps := partitionNames(t, in); len(ps) != 0 {
		t.Errorf("the inbox table has partitions %v after the refused Partition", ps)
	}
}

// Partition partitions the archive by the day its events were delivered;
// the maintainer adds its days ahead and drops its days past
// ArchiveRetention whole, with the delivery records kept for their
// events, and leaves the newer days and the event table alone.
func TestArchivePartitions(t *testing.T) {
	ctx := context.Background()
	db := testdb.MySQL(t)
	st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
	old := archiveRows(t, st, make([]driver.Row, 2)...)
	backdate(t, st, 3, old...)
	if _, err := db.Exec(`INSERT INTO `+st.DeliveriesTable()+` (event_id, subscription, status, attempts, available_at, created_at) VALUES (?, 'x', 1, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`, old[0]); err != nil {
		t.Fatal(err)
	}
	recent := archiveRows(t, st, driver.Row{})[0]
	pending := insertLeased(t, st, "", driver.Row{Type: "Plain"})[0]

	now := time.Now().UTC().Truncate(24 * time.Hour)
	if err := st.Partition(ctx, sqlstore.PartitionConfig{Ahead: 2}); err != nil {
		t.Fatal(err)
	}
	ps, err := st.ArchivePartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	if want := []string{day(now, -3), day(now, -2), day(now, -1), day(now, 0), day(now, 1), day(now, 2), "pmax"}; !slices.Equal(names, want) {
		t.Fatalf("archive partitions = %v; want %v", names, want)
	}

	later := func() time.Time { return time.Now().AddDate(0, 0, 1) }
	res, err := st.MaintainPartitions(ctx, sqlstore.PartitionConfig{Ahead: 2, ArchiveRetention: 48 * time.Hour, Now: later})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.ArchiveAdded, []string{day(now, 3)}) || !slices.Equal(res.ArchiveDropped, []string{day(now, -3), day(now, -2)}) {
		t.Fatalf("archive added %v, dropped %v; want [%s] and [%s %s]", res.ArchiveAdded, res.ArchiveDropped, day(now, 3), day(now, -3), day(now, -2))
	}
	if len(res.Dropped) != 0 {
		t.Fatalf("event table days dropped %v with no Retention", res.Dropped)
	}
	for _, id := range old {
		if len(archived(t, st, id)) != 0 {
			t.Errorf("archived event %s of a dropped day is still there", id)
		}
	}
	if n := countEventRows(t, st, st.DeliveriesTable(), old[0]); n != 0 {
		t.Errorf("%d delivery rows of an event of a dropped archive day; want 0", n)
	}
	if len(archived(t, st, recent)) != 1 || inTable(t, st, pending) != 1 {
		t.Errorf("today's archived event or the pending event lost")
	}
	if again := archiveRows(t, st, driver.Row{})[0]; len(archived(t, st, again)) != 1 {
		t.Errorf("an event archived after the maintenance is not in the archive")
	}
}
