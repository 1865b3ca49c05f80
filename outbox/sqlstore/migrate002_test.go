package sqlstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// unmigrated returns a store over a fresh table name that nothing has
// created yet; its tables are dropped at the end of the test.
func unmigrated(t *testing.T, name string) (*sqlx.DB, *sqlstore.Store) {
	db := testdb.Open(t, name)
	st, err := sqlstore.New(db, sqlstore.Options{Table: testdb.TableName("outbox")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testdb.DropTable(t, db, st.Tables()...)
	})
	return db, st
}

// Migrations 002 and 003 apply to a table created and filled by version 001:
// Migrate adds the subscription and ordering tables and columns, the rows
// are untouched, and the
// engine delivers the pending ones (a NEW and a RETRY row) to its
// subscriptions, leaving the DONE one alone.
func TestMigrate002OnPopulated001Table(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db, st := unmigrated(t, name)
			ctx := context.Background()
			steps, err := st.Migrations()
			if err != nil || len(steps) < 2 || steps[0].Version != 1 || steps[1].Version != 2 {
				t.Fatalf("Migrations() = %d steps, %v; want 001 and 002", len(steps), err)
			}
			// Version 001 as an older release applied it.
			for _, stmt := range strings.Split(steps[0].SQL, ";") {
				if stmt = strings.TrimSpace(stmt); stmt != "" && !onlyComments(stmt) {
					if _, err := db.Exec(stmt); err != nil {
						t.Fatalf("apply 001: %v", err)
					}
				}
			}
			db.MustExec(`CREATE TABLE ` + st.SchemaTable() + ` (version INTEGER NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL)`)
			db.MustExec(db.Rebind(`INSERT INTO `+st.SchemaTable()+` (version, name) VALUES (?, ?)`), 1, steps[0].Name)
			ids := make([]string, 3)
			// Rows as that release wrote them: its columns only.
			var at any = time.Now().UTC()
			if name == "sqlite" {
				at = time.Now().UnixMicro()
			}
			for i := range ids {
				ids[i] = outbox.NewID()
				db.MustExec(db.Rebind(`INSERT INTO `+st.Table()+` (id, event_type, payload, payload_json, occurred_at, available_at, created_at) VALUES (?, 'T', ?, ?, ?, ?, ?)`),
					ids[i], []byte(`{}`), true, at, at, at)
			}
			db.MustExec(db.Rebind(`UPDATE `+st.Table()+` SET status = 2, attempts = 1, last_error = 'old failure' WHERE id = ?`), ids[1])
			db.MustExec(db.Rebind(`UPDATE `+st.Table()+` SET status = 1 WHERE id = ?`), ids[2])

			if err := st.Migrate(ctx); err != nil {
				t.Fatalf("Migrate over 001: %v", err)
			}
			if err := st.Migrate(ctx); err != nil {
				t.Fatalf("Migrate again: %v", err)
			}
			ob, err := outbox.New(st, outbox.Config{PollInterval: 10 * time.Millisecond, SkipRecent: -1})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan outbox.Event, 3)
			ob.Handle("projection", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, "T")
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer ob.Close(ctx)
			seen := map[string]int{}
			for range 2 {
				select {
				case ev := <-got:
					seen[ev.ID] = ev.Attempt
				case <-time.After(10 * time.Second):
					t.Fatalf("delivered %v; want the NEW and the RETRY row", seen)
				}
			}
			if seen[ids[0]] != 1 || seen[ids[1]] != 2 {
				t.Fatalf("delivered %v; want %s at attempt 1 and %s at attempt 2", seen, ids[0], ids[1])
			}
			if err := ob.Close(ctx); err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				rec, err := st.Inspect(ctx, id)
				if err != nil || rec.Status != outbox.StatusDone {
					t.Fatalf("event %s after delivery: %v, %v; want DONE", id, rec.Status, err)
				}
			}
			select {
			case ev := <-got:
				t.Fatalf("the DONE row %s was delivered", ev.ID)
			default:
			}
			if _, err := st.Inspect(ctx, "missing"); !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("Inspect(missing) = %v", err)
			}
		})
	}
}

func onlyComments(stmt string) bool {
	for line := range strings.Lines(stmt) {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

// Migration 004 (PostgreSQL and SQLite: the unique index on a key's
// numbers) applies to a table that version 003 filled with ordered and
// unordered events, and the numbering goes on after the highest number
// stored.
func TestMigrate004OnPopulated003Table(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db, st := unmigrated(t, name)
			ctx := context.Background()
			steps, err := st.Migrations()
			if err != nil {
				t.Fatal(err)
			}
			db.MustExec(`CREATE TABLE ` + st.SchemaTable() + ` (version INTEGER NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL)`)
			for _, m := range steps {
				if m.Version > 3 {
					continue
				}
				for _, stmt := range sqlstore.SplitStatements(m.SQL) {
					if _, err := db.Exec(stmt); err != nil {
						t.Fatalf("apply %s: %v", m.Name, err)
					}
				}
				db.MustExec(db.Rebind(`INSERT INTO `+st.SchemaTable()+` (version, name) VALUES (?, ?)`), m.Version, m.Name)
			}
			// Ordered events of two keys, numbered as version 003 did, and
			// unordered ones.
			for _, key := range []string{"a", "b"} {
				for seq := 1; seq <= 3; seq++ {
					r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: key}
					if _, _, err := st.InsertOrdered(ctx, db, &r, "", 0, driver.OrderFilter{}); err != nil {
						t.Fatalf("InsertOrdered before 004: %v", err)
					}
				}
			}
			for range 3 {
				r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
				if err := st.Insert(ctx, db, &r, "", 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.Migrate(ctx); err != nil {
				t.Fatalf("Migrate over a populated 003 table: %v", err)
			}
			var rows int
			if err := db.QueryRowx(`SELECT COUNT(*) FROM ` + st.Table()).Scan(&rows); err != nil || rows != 9 {
				t.Fatalf("rows after the migration: %d, %v; want 9", rows, err)
			}
			r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: "a"}
			if _, _, err := st.InsertOrdered(ctx, db, &r, "", 0, driver.OrderFilter{}); err != nil {
				t.Fatalf("InsertOrdered after 004: %v", err)
			}
			if r.KeySeq != 4 {
				t.Fatalf("the next event of a key numbered 1–3 before the migration got number %d; want 4", r.KeySeq)
			}
		})
	}
}
