package sqlstore_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The version strings servers answer SELECT VERSION() with (SQLite:
// sqlite_version()): those the store is known not to work on are refused
// with an error that names the server, quotes its version and names the
// option that overrides the refusal; the others pass.
func TestCheckServerVersion(t *testing.T) {
	cases := []struct {
		dialect, version string
		refused          string // the server the error names; "" passes
	}{
		{"mysql", "10.11.19-MariaDB-0+deb12u1", ""}, // the server here
		{"mysql", "10.6.0-MariaDB", ""},
		{"mysql", "11.4.2-MariaDB-ubu2404", ""},
		{"mysql", "5.5.5-10.6.16-MariaDB", ""},
		{"mysql", "10.5.23-MariaDB-log", "MariaDB"},
		{"mysql", "5.5.5-10.4.32-MariaDB", "MariaDB"},
		{"mysql", "8.0.36", ""},
		{"mysql", "8.4.0", ""},
		{"mysql", "9.1.0", ""},
		{"mysql", "8.0.35-27", ""}, // Percona Server
		{"mysql", "8.0.28", ""},    // Aurora MySQL 3
		{"mysql", "5.7.12", "MySQL"},
		{"mysql", "5.7.44-log", "MySQL"},
		{"mysql", "8.0.0-dmr", "MySQL"},
		{"mysql", "8.0.11-TiDB-v7.5.0", "TiDB"},
		{"mysql", "5.7.25-TiDB-v6.5.0", "TiDB"},
		{"mysql", "8.0.30-Vitess", "Vitess/PlanetScale"},
		{"mysql", "8.0.34-PlanetScale", "Vitess/PlanetScale"},
		{"mysql", "", ""}, // nothing known of it
		{"postgres", "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc (Debian 12.2.0-14+deb12u1) 12.2.0, 64-bit", ""},
		{"postgres", "PostgreSQL 13.0 on x86_64-pc-linux-gnu", ""},
		{"postgres", "PostgreSQL 16.1 on aarch64-unknown-linux-gnu, compiled by aarch64-unknown-linux-gnu-gcc (GCC) 9.5.0, 64-bit", ""}, // Aurora PostgreSQL
		{"postgres", "PostgreSQL 17beta1 on x86_64-pc-linux-gnu", ""},
		{"postgres", "PostgreSQL 12.19 on x86_64-pc-linux-gnu", "PostgreSQL"},
		{"postgres", "PostgreSQL 8.0.2 on i686-pc-linux-gnu, compiled by GCC gcc (GCC) 3.4.2 20041017 (Red Hat 3.4.2-6.fc3), Redshift 1.0.77467", "PostgreSQL"},
		{"postgres", "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)", "CockroachDB"},
		{"postgres", "PostgreSQL 11.2-YB-2.18.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3", "YugabyteDB"},
		{"postgres", "PostgreSQL 15.2-YB-2024.2.0.0-b0 on x86_64-pc-linux-gnu", "YugabyteDB"},
		{"sqlite", "3.46.0", ""},
		{"sqlite", "3.42.0", ""},
		{"sqlite", "3.41.2", "SQLite"},
		{"sqlite", "3.7.17", "SQLite"},
	}
	for _, c := range cases {
		err := sqlstore.CheckServerVersion(c.dialect, c.version)
		if c.refused == "" {
			if err != nil {
				t.Errorf("%s %q refused: %v", c.dialect, c.version, err)
			}
			continue
		}
		if !errors.Is(err, sqlstore.ErrUnsupportedServer) {
			t.Errorf("%s %q: %v; want ErrUnsupportedServer", c.dialect, c.version, err)
			continue
		}
		for _, want := range []string{c.refused + " (version " + `"` + c.version + `"`, "AllowUnsupportedServer", "docs/databases.md"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s %q: %v; want it to say %q", c.dialect, c.version, err, want)
			}
		}
	}
}

// The servers the tests run on pass the check, and Migrate (which every
// store test calls) with it.
func TestRealServersAreSupported(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st, err := sqlstore.New(testdb.Open(t, name), sqlstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := st.CheckServer(context.Background()); err != nil {
				t.Fatalf("CheckServer: %v", err)
			}
		})
	}
}

// Migrate refuses a server that CheckServer refuses, before it creates
// anything, and AllowUnsupportedServer overrides that. The server is the
// real PostgreSQL, whose version() a function of a private schema ahead
// of pg_catalog in the search_path replaces with CockroachDB's.
func TestMigrateRefusesAnUnsupportedServer(t *testing.T) {
	admin := testdb.Postgres(t)
	schema := testdb.TableName("crdb")
	ctx := context.Background()
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	const crdb = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	if _, err := admin.Exec(`CREATE FUNCTION ` + schema + `.version() RETURNS text LANGUAGE sql AS $$ SELECT '` + crdb + `'::text $$`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testdb.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema+",pg_catalog")
	u.RawQuery = q.Encode()
	db, err := sqlx.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the schema is dropped

	st, err := sqlstore.New(db, sqlstore.Options{Table: "outbox_event"})
	if err != nil {
		t.Fatal(err)
	}
	err = st.Migrate(ctx)
	if !errors.Is(err, sqlstore.ErrUnsupportedServer) || !strings.Contains(err.Error(), "CockroachDB") || !strings.Contains(err.Error(), "AllowUnsupportedServer") {
		t.Fatalf("Migrate on a server whose version() says CockroachDB: %v; want ErrUnsupportedServer naming CockroachDB and AllowUnsupportedServer", err)
	}
	var tables int
	if err := admin.Get(&tables, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("the refused Migrate created %d tables", tables)
	}

	st, err = sqlstore.New(db, sqlstore.Options{Table: "outbox_event", AllowUnsupportedServer: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatalf("Migrate with AllowUnsupportedServer: %v", err)
	}
	if _, err := st.Claim(ctx, driver.ClaimRequest{Owner: "me", Limit: 1, Lease: time.Second}); err != nil {
		t.Fatalf("Claim on the table that Migrate made: %v", err)
	}
}
