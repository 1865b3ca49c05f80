package sqlstore_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Closing the *sql.DB before the Outbox is a mistake of order that the
// engine can only notice: Close returns an error that names the order
// (issue 37, item 14), instead of nil after logging the symptom.
func TestCloseAfterTheDatabaseNamesTheOrder(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			own, store := ownHandle(t, name)
			ob, err := outbox.New(store, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("h", func(context.Context, outbox.Event) error { return nil }, "T")
			ctx := context.Background()
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := own.Close(); err != nil {
				t.Fatal(err)
			}
			err = ob.Close(ctx)
			if err == nil || !strings.Contains(err.Error(), "close the Outbox before the *sql.DB") {
				t.Fatalf("Close after the *sql.DB was closed: %v; want an error that names the order", err)
			}
		})
	}
}

// ownHandle returns a *sql.DB of the test's own, which it may close, and
// a store on a migrated outbox table through it.
func ownHandle(t *testing.T, name string) (*sqlx.DB, *sqlstore.Store) {
	t.Helper()
	var own *sqlx.DB
	var err error
	table := ""
	switch name {
	case "sqlite":
		own, err = sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "own.db")))
	default:
		st := testdb.Store(t, testdb.Open(t, name)) // the table, dropped at the end
		table = strings.Trim(st.Table(), "`\"")
		driverName, dsn := "mysql", testdb.MySQLDSN()
		if name == "postgres" {
			driverName, dsn = "pgx", testdb.PostgresDSN()
		}
		own, err = sqlx.Open(driverName, dsn)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	store, err := sqlstore.New(own, sqlstore.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if name == "sqlite" {
		if err := store.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return own, store
}
