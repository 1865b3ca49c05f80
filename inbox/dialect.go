package inbox

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Dialect is what differs between the databases the inbox runs on: the
// SQL of "now", of an insert that skips an existing key, of an upsert and
// of a batched delete, and how times are stored. Use MySQL, Postgres or
// SQLite (or DialectNamed with the name of a sqlstore dialect).
type Dialect struct {
	name string
	// now is the database's current time as a column value; nowMinus is
	// now minus a bound number of microseconds.
	now, nowMinus string
	// insert and skipExisting wrap an INSERT that does nothing when the
	// key exists (and reports 0 rows affected).
	insert, skipExisting string
	// upsertFailure is the tail of the failure count's INSERT.
	upsertFailure string
	// deleteLimit: DELETE takes a LIMIT (MySQL); else the batch is the
	// keys of a SELECT … LIMIT.
	deleteLimit bool
	quote       func(string) string
	// primaryKey returns the query listing the columns of a table's
	// primary key in order, and its arguments, given the table's schema
	// ("" for the current one), name and quoted name.
	primaryKey func(schema, name, quoted string) (string, []any)
	dollar     bool // $1 placeholders
	micros     bool // times are integer microseconds since the epoch
}

const sqliteNow = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"

var (
	// MySQL is MySQL 8.0+ and MariaDB 10.6+.
	MySQL = &Dialect{
		name:          "mysql",
		now:           "UTC_TIMESTAMP(6)",
		nowMinus:      "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)",
		insert:        "INSERT IGNORE INTO ",
		upsertFailure: " ON DUPLICATE KEY UPDATE attempts = attempts + 1, last_error = ?, failed_at = UTC_TIMESTAMP(6)",
		deleteLimit:   true,
		quote:         func(s string) string { return "`" + s + "`" },
		primaryKey: func(schema, name, _ string) (string, []any) {
			return `SELECT COLUMN_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX`, []any{schema, name}
		},
	}
	// Postgres is PostgreSQL 12+.
	Postgres = &Dialect{
		name:          "postgres",
		now:           "clock_timestamp()",
		nowMinus:      "(clock_timestamp() - ? * INTERVAL '1 microsecond')",
		insert:        "INSERT INTO ",
		skipExisting:  " ON CONFLICT (consumer, message_id) DO NOTHING",
		upsertFailure: " ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = {{t}}.attempts + 1, last_error = ?, failed_at = clock_timestamp()",
		quote:         func(s string) string { return `"` + s + `"` },
		dollar:        true,
		primaryKey: func(_, _, quoted string) (string, []any) {
			return `SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass($1) AND i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)`, []any{quoted}
		},
	}
	// SQLite is SQLite 3.42+ (modernc.org/sqlite), opened with
	// sqlstore.SQLiteDSN.
	SQLite = &Dialect{
		name:          "sqlite",
		now:           sqliteNow,
		nowMinus:      "(" + sqliteNow + " - ?)",
		insert:        "INSERT INTO ",
		skipExisting:  " ON CONFLICT (consumer, message_id) DO NOTHING",
		upsertFailure: " ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = {{t}}.attempts + 1, last_error = ?, failed_at = " + sqliteNow,
		quote:         func(s string) string { return `"` + s + `"` },
		micros:        true,
		primaryKey: func(schema, name, _ string) (string, []any) {
			return `SELECT name FROM pragma_table_info(?, ?) WHERE pk > 0 ORDER BY pk`, []any{name, cmp.Or(schema, "main")}
		},
	}
)

// Name returns the dialect's name: "mysql", "postgres" or "sqlite".
func (d *Dialect) Name() string { return d.name }

func (d *Dialect) String() string { return d.name }

// DialectNamed returns the dialect of the given name ("mysql", "postgres"
// or "sqlite"): pass store.Dialect().Name() of a sqlstore.Store.
func DialectNamed(name string) (*Dialect, error) {
	switch name {
	case "mysql":
		return MySQL, nil
	case "postgres":
		return Postgres, nil
	case "sqlite":
		return SQLite, nil
	}
	return nil, fmt.Errorf("inbox: unknown dialect %q: use \"mysql\", \"postgres\" or \"sqlite\"", name)
}

// bind writes q's ? placeholders the dialect's way.
func (d *Dialect) bind(q string) string {
	if !d.dollar {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// age binds a duration for nowMinus.
func (d *Dialect) age(dur time.Duration) any { return dur.Microseconds() }

// scanTime converts a scanned time column.
func (d *Dialect) scanTime(v any) (time.Time, error) {
	switch t := v.(type) {
	case time.Time:
		return t.UTC(), nil
	case int64:
		return time.UnixMicro(t).UTC(), nil
	case []byte:
		return parseTime(string(t))
	case string:
		return parseTime(t)
	case nil:
		return time.Time{}, nil
	}
	return time.Time{}, fmt.Errorf("inbox: unexpected time value %T", v)
}

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse("2006-01-02 15:04:05.999999", s)
	if err != nil {
		return time.Time{}, fmt.Errorf("inbox: parse time %q: %w", s, err)
	}
	return t, nil
}
