package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/migrations"
)

// Migration is one schema step of a dialect.
type Migration struct {
	Version int
	Name    string
	SQL     string // with {{table}} and {{name}} substituted
}

// Migrations returns the store's schema steps in order, with the table
// name filled in: what Migrate applies, for tools that want to show or
// apply the SQL themselves.
func (s *Store) Migrations() ([]Migration, error) {
	files, err := fs.Glob(migrations.FS, s.d.name+"/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	out := make([]Migration, 0, len(files))
	for _, f := range files {
		base := path.Base(f)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: name must start with a number and an underscore", f)
		}
		b, err := migrations.FS.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sqlText := strings.NewReplacer("{{table}}", s.table, "{{name}}", s.name,
			"{{subscriptions}}", s.SubscriptionsTable(), "{{deliveries}}", s.DeliveriesTable(), "{{attempts}}", s.AttemptsTable(), "{{keys}}", s.KeysTable(), "{{registry}}", s.RegistryTable(),
			"{{inbox}}", s.InboxTable(), "{{inbox_failures}}", s.InboxFailuresTable(), "{{archive}}", s.ArchiveTable()).Replace(string(b))
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(base, ".sql"), SQL: sqlText})
	}
	return out, nil
}

// SchemaTable returns the quoted name of the table that records applied
// migrations: the outbox table's name with "_schema" appended.
func (s *Store) SchemaTable() string {
	return s.table[:len(s.table)-1] + "_schema" + s.table[len(s.table)-1:]
}

// Migrate creates or upgrades the outbox table. It runs on its own
// connection, never inside a request's transaction, takes a database lock
// (MySQL GET_LOCK, PostgreSQL advisory lock) so that instances starting
// together apply each step once, and records the applied versions in
// <table>_schema. It is safe to call at every start.
//
// First it refuses a server the store is known not to work on (see
// CheckServer), unless Options.AllowUnsupportedServer is set.
func (s *Store) Migrate(ctx context.Context) (err error) {
	steps, err := s.Migrations()
	if err != nil {
		return err
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	defer conn.Close()
	if !s.anyServer {
		if err := s.checkServer(ctx, conn); err != nil {
			return err
		}
	}
	if s.d.checkConn != nil {
		if err := s.d.checkConn(ctx, conn); err != nil {
			return err
		}
	}
	if s.d.migrationLock != "" {
		lockName, err := s.lockName(ctx, conn, "txoutbox_migrate_")
		if err != nil {
			return fmt.Errorf("sqlstore: migrate: %w", err)
		}
		if err := s.lockMigration(ctx, conn, lockName); err != nil {
			return err
		}
		defer func() {
			_, uerr := conn.ExecContext(context.WithoutCancel(ctx), s.rebind(s.d.migrationUnlock), lockName)
			if uerr != nil {
				err = errors.Join(err, fmt.Errorf("sqlstore: migrate: unlock: %w", uerr))
			}
		}()
	}
	versions := s.SchemaTable()
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+versions+` (version INTEGER NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL)`); err != nil {
		return fmt.Errorf("sqlstore: migrate: create %s: %w", versions, err)
	}
	applied := map[int]bool{}
	rs, err := conn.QueryContext(ctx, `SELECT version FROM `+versions)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: read %s: %w", versions, err)
	}
	for rs.Next() {
		var v int
		if err := rs.Scan(&v); err != nil {
			rs.Close()
			return err
		}
		applied[v] = true
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return fmt.Errorf("sqlstore: migrate: read %s: %w", versions, err)
	}
	for _, m := range steps {
		if applied[m.Version] {
			continue
		}
		for _, stmt := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("sqlstore: migrate: %s: %w", m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, s.rebind(`INSERT INTO `+versions+` (version, name) VALUES (?, ?)`), m.Version, m.Name); err != nil {
			return fmt.Errorf("sqlstore: migrate: record %s: %w", m.Name, err)
		}
	}
	return nil
}

// lockMigration takes the migration lock on conn. MySQL's GET_LOCK waits
// until ctx's deadline (60 s without one) and answers 0 on a timeout and
// NULL on an error, which must not be taken for success; PostgreSQL's
// advisory lock waits until ctx ends.
func (s *Store) lockMigration(ctx context.Context, conn *sql.Conn, name string) error {
	if !s.d.lockTimeout {
		if _, err := conn.ExecContext(ctx, s.rebind(s.d.migrationLock), name); err != nil {
			return fmt.Errorf("sqlstore: migrate: waiting for the migration lock %q (another instance is migrating the table): %w", name, err)
		}
		return nil
	}
	wait := 60 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	secs := max(0, int(wait.Seconds()))
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, s.rebind(s.d.migrationLock), name, secs).Scan(&got); err != nil {
		return fmt.Errorf("sqlstore: migrate: take the migration lock %q: %w", name, err)
	}
	switch {
	case !got.Valid:
		return fmt.Errorf("sqlstore: migrate: take the migration lock %q: GET_LOCK failed (NULL); nothing was migrated", name)
	case got.Int64 != 1:
		return fmt.Errorf("sqlstore: migrate: the migration lock %q is held by another session (an instance migrating, or a stuck session: see SELECT IS_USED_LOCK(%q)); gave up after %ds, nothing was migrated", name, name, secs)
	}
	return nil
}

// lockName returns the name of the named lock prefix takes on the
// store's table: the prefix, then the table qualified by its database.
// MySQL's named locks (GET_LOCK) belong to the server, not to a database:
// with the bare table name, the stores of tenant shards that are
// databases of one server, whose tables share a name, took each other's
// locks (MaintainPartitions of one found another's held and did nothing).
// PostgreSQL's advisory locks belong to the database already; there the
// schema is added only when Options.Table names one. Names longer than
// 64 characters, MySQL's limit, end in a hash of the whole instead.
func (s *Store) lockName(ctx context.Context, conn interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, prefix string) (string, error) {
	qual := s.schema
	if qual == "" && s.d.name == "mysql" {
		var db sql.NullString
		if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&db); err != nil {
			return "", fmt.Errorf("name the lock: %w", err)
		}
		qual = db.String
	}
	name := prefix + s.name
	if qual != "" {
		name = prefix + qual + "." + s.name
	}
	if len(name) > 64 {
		h := fnv.New64a()
		h.Write([]byte(name))
		name = fmt.Sprintf("%s_%016x", name[:64-17], h.Sum64())
	}
	return name, nil
}

// splitStatements splits a migration file on semicolons that end a line,
// dropping comment-only lines.
func splitStatements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
