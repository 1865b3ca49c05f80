package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnsupportedServer is what the error of CheckServer, and of Migrate,
// matches (errors.Is) when the database server is one the store is known
// not to work on. docs/databases.md says why for each.
var ErrUnsupportedServer = errors.New("sqlstore: unsupported database server")

// CheckServer asks the database for its version string and returns an
// error matching ErrUnsupportedServer if the server is one the store is
// known not to work on: TiDB, Vitess or PlanetScale, MariaDB before 10.6
// or MySQL before 8.0.1 (no FOR UPDATE SKIP LOCKED), CockroachDB,
// YugabyteDB, PostgreSQL before 13, SQLite before 3.42. The error names
// the server and the reason. Migrate calls it first unless
// Options.AllowUnsupportedServer is set; call it yourself if you apply
// the migrations by other means.
func (s *Store) CheckServer(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlstore: check the server: %w", err)
	}
	defer conn.Close()
	return s.checkServer(ctx, conn)
}

// checkServer is CheckServer on conn.
func (s *Store) checkServer(ctx context.Context, conn *sql.Conn) error {
	q := `SELECT VERSION()`
	if s.d.name == "sqlite" {
		q = `SELECT sqlite_version()`
	}
	var v string
	if err := conn.QueryRowContext(ctx, q).Scan(&v); err != nil {
		return fmt.Errorf("sqlstore: check the server: %s: %w", q, err)
	}
	return checkServerVersion(s.d.name, v)
}

// checkServerVersion is the rule behind CheckServer: the server whose
// version string (SELECT VERSION(); sqlite_version() on SQLite) is
// version, under the dialect named dialect, is refused with the reason,
// or nil. A server it does not recognise is not refused.
func checkServerVersion(dialect, version string) error {
	var name, why string
	v := strings.ToLower(version)
	switch dialect {
	case "mysql":
		name, why = mysqlServer(v)
	case "postgres":
		name, why = postgresServer(v)
	case "sqlite":
		name, why = sqliteServer(v)
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %s (version %q): %s; see docs/databases.md. To run on it anyway, at your own risk, set sqlstore.Options{AllowUnsupportedServer: true}",
		ErrUnsupportedServer, name, version, why)
}

// mysqlServer names a MySQL-dialect server that does not work, and why.
func mysqlServer(v string) (name, why string) {
	switch {
	case strings.Contains(v, "tidb"):
		return "TiDB", "TiDB does not honour FOR UPDATE SKIP LOCKED (it reads the rows without locking them), so two instances would claim, and deliver, the same events"
	case strings.Contains(v, "vitess"), strings.Contains(v, "planetscale"):
		return "Vitess/PlanetScale", "Vitess rejects FOR UPDATE SKIP LOCKED (releases before vitessio/vitess#5249), and on a sharded keyspace a claim is not one transaction nor GET_LOCK one lock"
	case strings.Contains(v, "mariadb"):
		// Old clients' handshakes put "5.5.5-" in front of MariaDB's
		// version; VERSION() does not, but a proxy might.
		if older(strings.TrimPrefix(v, "5.5.5-"), 10, 6, 0) {
			return "MariaDB", "MariaDB before 10.6 has no FOR UPDATE SKIP LOCKED, which every claim uses"
		}
	default:
		if older(v, 8, 0, 1) {
			return "MySQL", "MySQL before 8.0.1 has no FOR UPDATE SKIP LOCKED, which every claim uses"
		}
	}
	return "", ""
}

// postgresServer names a PostgreSQL-dialect server that does not work,
// and why.
func postgresServer(v string) (name, why string) {
	switch {
	case strings.Contains(v, "cockroachdb"):
		return "CockroachDB", "CockroachDB's pg_advisory_lock, the migration lock, locks nothing, and its transactions are SERIALIZABLE unless READ COMMITTED is enabled for the cluster; the store was never run on it"
	case strings.Contains(v, "-yb-"):
		return "YugabyteDB", "YugabyteDB runs READ COMMITTED as snapshot isolation unless yb_enable_read_committed_isolation is set, and has advisory locks (the migration lock) on by default only from 2.27; the store was never run on it"
	}
	rest, ok := strings.CutPrefix(v, "postgresql ")
	if ok && older(rest, 13, 0, 0) {
		return "PostgreSQL", "PostgreSQL before 13 is past the oldest release the store is supported on (13; tested on 15)"
	}
	return "", ""
}

// sqliteServer names a SQLite library that does not work, and why.
func sqliteServer(v string) (name, why string) {
	if older(v, 3, 42, 0) {
		return "SQLite", "SQLite before 3.42 has no unixepoch('subsec'), the clock the store reads"
	}
	return "", ""
}

// older reports whether v starts with a version (major[.minor[.patch]])
// before major.minor.patch. A v that does not start with a number is not
// older: nothing is known of it.
func older(v string, major, minor, patch int) bool {
	got, ok := leadingVersion(v)
	if !ok {
		return false
	}
	for i, want := range [3]int{major, minor, patch} {
		if got[i] != want {
			return got[i] < want
		}
	}
	return false
}

// leadingVersion parses the dotted numbers v starts with: "10.11.19-MariaDB"
// gives 10, 11, 19; "15.20 (Debian …)" gives 15, 20, 0.
func leadingVersion(v string) ([3]int, bool) {
	var out [3]int
	for i := range out {
		n := 0
		for n < len(v) && v[n] >= '0' && v[n] <= '9' {
			n++
		}
		if n == 0 {
			return out, i > 0
		}
		out[i], _ = strconv.Atoi(v[:n])
		v = v[n:]
		if !strings.HasPrefix(v, ".") {
			return out, true
		}
		v = v[1:]
	}
	return out, true
}
