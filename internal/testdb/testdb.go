// Package testdb opens the real databases that tests run against: MariaDB
// or MySQL, PostgreSQL and SQLite, each with a fresh table per test.
//
// A server that cannot be reached makes the test skip with a message that
// says how to provide it, unless TXOUTBOX_REQUIRE_DB is set (CI sets it in
// .ci/run): then the test fails.
//
// Environment:
//
//	TXOUTBOX_MYSQL_DSN     default root@tcp(127.0.0.1:3306)/test?parseTime=true&interpolateParams=true
//	TXOUTBOX_POSTGRES_DSN  default postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	TXOUTBOX_REQUIRE_DB    non-empty: an unreachable database fails the test
package testdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Default DSNs for the servers on a developer's machine and in CI.
const (
	DefaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true&interpolateParams=true"
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

// Required reports whether an unreachable database must fail the test.
func Required() bool { return os.Getenv("TXOUTBOX_REQUIRE_DB") != "" }

// MySQLDSN returns the MariaDB/MySQL DSN tests use.
func MySQLDSN() string { return env("TXOUTBOX_MYSQL_DSN", DefaultMySQLDSN) }

// PostgresDSN returns the PostgreSQL DSN tests use.
func PostgresDSN() string { return env("TXOUTBOX_POSTGRES_DSN", DefaultPostgresDSN) }

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// MySQL opens the MariaDB/MySQL test database; it is closed when t ends.
func MySQL(t testing.TB) *sqlx.DB {
	return open(t, "mysql", MySQLDSN(), "MariaDB/MySQL", "TXOUTBOX_MYSQL_DSN")
}

// Postgres opens the PostgreSQL test database; it is closed when t ends.
func Postgres(t testing.TB) *sqlx.DB {
	return open(t, "pgx", PostgresDSN(), "PostgreSQL", "TXOUTBOX_POSTGRES_DSN")
}

// SQLite opens a new SQLite database file in a temporary directory with
// sqlstore.SQLiteDSN, but a 30 s busy timeout instead of 5 s; it is closed
// when t ends. Tests run several engines on one file under the race
// detector on a loaded machine, and SQLite's busy handler is not fair: a
// test's own transaction could lose every try for 5 s to the engines'
// writes (seen as SQLITE_BUSY at BEGIN, twice).
func SQLite(t testing.TB) *sqlx.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	dsn := sqlstore.SQLiteDSN(path)
	long := strings.Replace(dsn, "busy_timeout(5000)", "busy_timeout(30000)", 1)
	if long == dsn {
		t.Fatalf("testdb: sqlstore.SQLiteDSN no longer sets busy_timeout(5000) (%s): update the test timeout here", dsn)
	}
	db, err := sqlx.Open("sqlite", long)
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func open(t testing.TB, driver, dsn, what, envVar string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open(driver, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if db != nil {
			db.Close()
		}
		msg := fmt.Sprintf("%s is not reachable (%v); start it or point %s at one", what, err, envVar)
		if Required() {
			t.Fatalf("%s (TXOUTBOX_REQUIRE_DB is set, so this fails instead of skipping)", msg)
		}
		noteSkip(what, envVar)
		t.Skip(msg)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() { db.Close() })
	return db
}

// Open opens the named database: "mysql", "postgres" or "sqlite".
func Open(t testing.TB, name string) *sqlx.DB {
	switch name {
	case "mysql":
		return MySQL(t)
	case "postgres":
		return Postgres(t)
	case "sqlite":
		return SQLite(t)
	}
	t.Fatalf("testdb: unknown database %q", name)
	return nil
}

// Names lists the databases Open knows.
var Names = []string{"sqlite", "mysql", "postgres"}

// TableName returns a table name unique to this test run.
func TableName(prefix string) string {
	return strings.ToLower(prefix + "_" + outbox.NewID()[14:])
}

// Store returns a migrated sqlstore.Store on a fresh table in db; the
// table is dropped when t ends.
func Store(t testing.TB, db *sqlx.DB) *sqlstore.Store {
	t.Helper()
	return StoreWith(t, db, sqlstore.Options{})
}

// StoreWith is Store with options; a Table of its own is kept, else the
// fresh table's name is set.
func StoreWith(t testing.TB, db *sqlx.DB, opts sqlstore.Options) *sqlstore.Store {
	t.Helper()
	if opts.Table == "" {
		opts.Table = TableName("outbox")
	}
	s, err := sqlstore.New(db, opts)
	if err != nil {
		t.Fatalf("sqlstore.New: %v", err)
	}
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	t.Cleanup(func() {
		DropTable(t, db, s.Tables()...)
	})
	return s
}

// DropTable drops the given (already quoted) tables, reporting failures.
func DropTable(t testing.TB, db *sqlx.DB, tables ...string) {
	for _, tbl := range tables {
		if _, err := db.Exec("DROP TABLE IF EXISTS " + tbl); err != nil {
			t.Errorf("drop %s: %v", tbl, err)
		}
	}
}

// noteSkip records a database suite that did not run (see
// testbroker.NoteSkip).
func noteSkip(what, envVar string) { testbroker.NoteSkip(what, envVar) }
