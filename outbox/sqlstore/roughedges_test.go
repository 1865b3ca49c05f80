package sqlstore_test

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

var registerWrapped sync.Once

// A driver registered under another name (as tracing wrappers do) works
// once Options.Dialect is set: placeholders follow the dialect, not
// sqlx's table of driver names.
func TestWrappedDriverNameUsesDialectPlaceholders(t *testing.T) {
	testdb.Postgres(t) // skip, or fail in CI, without the server
	registerWrapped.Do(func() { sql.Register("wrapped-pgx", stdlib.GetDefaultDriver()) })
	db, err := sqlx.Open("wrapped-pgx", testdb.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the table is dropped
	if _, err := sqlstore.New(db, sqlstore.Options{}); err == nil || !strings.Contains(err.Error(), "Options.Dialect") {
		t.Fatalf("New without a dialect on an unknown driver: %v; want an error naming Options.Dialect", err)
	}
	st, err := sqlstore.New(db, sqlstore.Options{Dialect: sqlstore.Postgres, Table: testdb.TableName("wrapped")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, db, st.Table(), st.SchemaTable()) })
	ob, err := outbox.New(st, outbox.Config{DisableHotPath: true, SkipRecent: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil })
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
	if err != nil {
		t.Fatalf("publish through a wrapped driver: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.Poll(ctx); err != nil || n != 1 {
		t.Fatalf("Poll = %d, %v", n, err)
	}
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer ob.Close(ctx)
	select {
	case d := <-got:
		if d != id {
			t.Fatalf("delivered %s, published %s", d, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not delivered")
	}
}

// Publishing into a table that does not exist says to run Migrate.
func TestMissingTableSaysMigrate(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st, err := sqlstore.New(db, sqlstore.Options{Table: testdb.TableName("never_migrated")})
			if err != nil {
				t.Fatal(err)
			}
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
			tx.Rollback()
			if err == nil || !strings.Contains(err.Error(), "Migrate") {
				t.Fatalf("publish into a missing table: %v; want an error that says to run Migrate", err)
			}
			if _, err := st.Claim(ctx, driver.ClaimRequest{Owner: "me", Limit: 1, Lease: time.Second}); err == nil || !strings.Contains(err.Error(), "Migrate") {
				t.Fatalf("claim from a missing table: %v; want an error that says to run Migrate", err)
			}
		})
	}
}

// SQLite opened without sqlstore.SQLiteDSN (no busy timeout) is refused at
// Migrate with the fix, instead of failing transactions under load.
func TestSQLiteWithoutDSNIsRefused(t *testing.T) {
	db, err := sqlx.Open("sqlite", filepath.Join(t.TempDir(), "plain.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(context.Background()); err == nil || !strings.Contains(err.Error(), "SQLiteDSN") {
		t.Fatalf("Migrate on SQLite without a busy timeout: %v; want an error naming sqlstore.SQLiteDSN", err)
	}
}

// Publishing before Start is not silent: one warning says to call Start.
func TestPublishBeforeStartWarnsOnce(t *testing.T) {
	db := testdb.SQLite(t)
	st := testdb.Store(t, db)
	var logs bytes.Buffer
	ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ob.Handle("all", func(context.Context, outbox.Event) error { return nil })
	ctx := context.Background()
	for range 3 {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "not started"); n != 1 {
		t.Fatalf("%d warnings about publishing before Start; want 1. Logs:\n%s", n, logs.String())
	}
	ob.Close(ctx)
}
