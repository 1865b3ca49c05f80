package harness

import (
	"context"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/jmoiron/sqlx"
)

// Dialect is what the harness's own SQL needs to know about a database:
// DDL, the server clock, identifier quoting and Watermill's adapters. The
// placeholders are written `?` and rebound by sqlx for the database's
// driver. Systems take it from Env; none branches on a driver name.
type Dialect struct {
	// Name is the report's label: "MariaDB" or "PostgreSQL".
	Name string
	// Key is the -db flag's value: "mariadb" or "postgres".
	Key string
	// Driver is the database/sql driver name to open it with.
	Driver string
	// Now is the server's current time as a column value; Ago is it one
	// minute ago; NowPlusMicros adds a bound number of microseconds.
	Now, Ago, NowPlusMicros string
	// NowMinusMicros subtracts a bound number of microseconds.
	NowMinusMicros string
	// NowPlusHour is an hour from now.
	NowPlusHour string
	quote       func(string) string
	// ordersDDL and minimalDDL are CREATE statements with %[1]s for the
	// quoted table name and %[2]s for an unquoted prefix for index names.
	ordersDDL  string
	minimalDDL []string
	// keyedMinimalDDL is minimalDDL with the event's ordering key and its
	// number in the key (RawKeyed).
	keyedMinimalDDL []string
	// keyUpsert (MySQL) is sqlstore's upsert of a key row (%[1]s the key
	// table), which returns the key's next number packed in
	// LAST_INSERT_ID; keyCTE (PostgreSQL) is sqlstore's CTE that upserts
	// it, for an INSERT that reads the number as (SELECT seq FROM k).
	// One of them is set.
	keyUpsert, keyCTE string
	// watermill returns the schema and offsets adapters of Watermill's
	// SQL Pub/Sub for the database, with the given quoted table names.
	watermill func(msgs, offs func(topic string) string, batch int) (wsql.SchemaAdapter, wsql.OffsetsAdapter)
	// WatermillAdapters names them for the report.
	WatermillAdapters string
	// logPos reads the server's write-ahead log position in bytes (the
	// redo log's LSN on MariaDB, the WAL insert position on PostgreSQL):
	// the difference over a run is the log the server wrote in it.
	logPos string
}

// LogPos returns the server's write-ahead log position in bytes, or -1
// if it cannot be read (no privilege, another server).
func (d *Dialect) LogPos(ctx context.Context, db *sqlx.DB) int64 {
	var n int64
	if d.logPos == "" || db.QueryRowContext(ctx, d.logPos).Scan(&n) != nil {
		return -1
	}
	return n
}

// Quote quotes an identifier.
func (d *Dialect) Quote(name string) string { return d.quote(name) }

// MariaDB is MariaDB 10.6+ / MySQL 8 through go-sql-driver/mysql.
var MariaDB = &Dialect{
	logPos:         "SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_LSN_CURRENT'",
	Name:           "MariaDB",
	Key:            "mariadb",
	Driver:         "mysql",
	Now:            "UTC_TIMESTAMP(6)",
	Ago:            "(UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE)",
	NowPlusMicros:  "(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
	NowMinusMicros: "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)",
	NowPlusHour:    "(UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
	quote:          func(s string) string { return "`" + s + "`" },
	ordersDDL: `CREATE TABLE %[1]s (
  id          BIGINT      NOT NULL PRIMARY KEY,
  customer_id VARCHAR(32) NOT NULL,
  total_cents BIGINT      NOT NULL,
  status      VARCHAR(16) NOT NULL,
  created_at  DATETIME(6) NOT NULL
) ENGINE=InnoDB`,
	minimalDDL: []string{`CREATE TABLE %[1]s (
  id           BINARY(16)   NOT NULL PRIMARY KEY,
  event_type   VARCHAR(128) NOT NULL,
  aggregate_id VARCHAR(128) NOT NULL,
  payload      JSON         NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  KEY %[2]s_created (created_at)
) ENGINE=InnoDB`},
	keyedMinimalDDL: []string{`CREATE TABLE %[1]s (
  id           BINARY(16)   NOT NULL PRIMARY KEY,
  event_type   VARCHAR(128) NOT NULL,
  aggregate_id VARCHAR(128) NOT NULL,
  payload      JSON         NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  ordering_key VARCHAR(255) NOT NULL,
  key_seq      BIGINT       NOT NULL,
  KEY %[2]s_created (created_at)
) ENGINE=InnoDB`},
	keyUpsert: `INSERT INTO %[1]s (ordering_key, seq, done_seq) VALUES (?, 1, 0)
ON DUPLICATE KEY UPDATE seq = LAST_INSERT_ID((seq + 1) * 2 + (done_seq < seq)) DIV 2`,
	watermill: func(msgs, offs func(string) string, batch int) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
		return wsql.DefaultMySQLSchema{GenerateMessagesTableName: msgs, SubscribeBatchSize: batch},
			wsql.DefaultMySQLOffsetsAdapter{GenerateMessagesOffsetsTableName: offs}
	},
	WatermillAdapters: "DefaultMySQLSchema + DefaultMySQLOffsetsAdapter",
}

// PostgreSQL is PostgreSQL 13+ through pgx's database/sql driver.
var PostgreSQL = &Dialect{
	logPos:         "SELECT CAST(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0') AS BIGINT)",
	Name:           "PostgreSQL",
	Key:            "postgres",
	Driver:         "pgx",
	Now:            "clock_timestamp()",
	Ago:            "(clock_timestamp() - INTERVAL '1 minute')",
	NowPlusMicros:  "(clock_timestamp() + ? * INTERVAL '1 microsecond')",
	NowMinusMicros: "(clock_timestamp() - ? * INTERVAL '1 microsecond')",
	NowPlusHour:    "(clock_timestamp() + INTERVAL '1 hour')",
	quote:          func(s string) string { return `"` + s + `"` },
	ordersDDL: `CREATE TABLE %[1]s (
  id          BIGINT      NOT NULL PRIMARY KEY,
  customer_id VARCHAR(32) NOT NULL,
  total_cents BIGINT      NOT NULL,
  status      VARCHAR(16) NOT NULL,
  created_at  TIMESTAMPTZ NOT NULL
)`,
	minimalDDL: []string{`CREATE TABLE %[1]s (
  id           BYTEA        NOT NULL PRIMARY KEY,
  event_type   VARCHAR(128) NOT NULL,
  aggregate_id VARCHAR(128) NOT NULL,
  payload      JSONB        NOT NULL,
  created_at   TIMESTAMPTZ  NOT NULL
)`, `CREATE INDEX %[2]s_created ON %[1]s (created_at)`},
	keyedMinimalDDL: []string{`CREATE TABLE %[1]s (
  id           BYTEA        NOT NULL PRIMARY KEY,
  event_type   VARCHAR(128) NOT NULL,
  aggregate_id VARCHAR(128) NOT NULL,
  payload      JSONB        NOT NULL,
  created_at   TIMESTAMPTZ  NOT NULL,
  ordering_key VARCHAR(255) NOT NULL,
  key_seq      BIGINT       NOT NULL
)`, `CREATE INDEX %[2]s_created ON %[1]s (created_at)`},
	keyCTE: `WITH k AS (INSERT INTO %[1]s AS k (ordering_key, seq, done_seq) VALUES (?, 1, 0)
ON CONFLICT (ordering_key) DO UPDATE SET seq = k.seq + 1 RETURNING seq, done_seq >= seq - 1 AS head)
`,
	watermill: func(msgs, offs func(string) string, batch int) (wsql.SchemaAdapter, wsql.OffsetsAdapter) {
		return wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: msgs, SubscribeBatchSize: batch},
			wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: offs}
	},
	WatermillAdapters: "DefaultPostgreSQLSchema + DefaultPostgreSQLOffsetsAdapter",
}

// Dialects lists the databases the harness knows, in report order.
var Dialects = []*Dialect{MariaDB, PostgreSQL}

// DialectByKey returns the dialect of a -db flag value.
func DialectByKey(key string) (*Dialect, error) {
	for _, d := range Dialects {
		if d.Key == key {
			return d, nil
		}
	}
	return nil, fmt.Errorf("harness: unknown database %q (want mariadb or postgres)", key)
}

// dialectOf returns the dialect of db's driver.
func dialectOf(db *sqlx.DB) *Dialect {
	for _, d := range Dialects {
		if d.Driver == db.DriverName() {
			return d
		}
	}
	switch db.DriverName() {
	case "postgres", "pgx/v5":
		return PostgreSQL
	}
	return MariaDB
}

// insertOrderSQL is the INSERT of one order row, placeholders rebound for db.
func insertOrderSQL(db *sqlx.DB, orders string) string {
	return db.Rebind(`INSERT INTO ` + orders + ` (id, customer_id, total_cents, status, created_at) VALUES (?, ?, ?, 'placed', ` + dialectOf(db).Now + `)`)
}

// createOrders creates the orders table (quoted name).
func createOrders(ctx context.Context, db *sqlx.DB, quoted string) error {
	_, err := db.ExecContext(ctx, fmt.Sprintf(dialectOf(db).ordersDDL, quoted))
	return err
}

// createKeyedMinimal creates the minimal outbox table with the ordering
// columns (quoted name; prefix names its index).
func createKeyedMinimal(ctx context.Context, db *sqlx.DB, quoted, prefix string) error {
	for _, q := range dialectOf(db).keyedMinimalDDL {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(q, quoted, prefix)); err != nil {
			return fmt.Errorf("harness: create keyed minimal outbox table: %w", err)
		}
	}
	return nil
}

// createMinimal creates the minimal outbox table (quoted name; prefix
// names its index).
func createMinimal(ctx context.Context, db *sqlx.DB, quoted, prefix string) error {
	for _, q := range dialectOf(db).minimalDDL {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(q, quoted, prefix)); err != nil {
			return fmt.Errorf("harness: create minimal outbox table: %w", err)
		}
	}
	return nil
}
