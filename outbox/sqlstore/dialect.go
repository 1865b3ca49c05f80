package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// Dialect is what differs between databases: the SQL for "now", for time
// arithmetic and for row locking, and how times are stored. It is a value,
// not a branch scattered through the code; the three dialects below are
// the ones supported.
type Dialect struct {
	name string
	// now is the database's current time as a column value.
	now string
	// boundNow: now, where it bounds an index range (available_at <=
	// now), is written as a scalar subquery (Dialect.bound).
	// PostgreSQL's clock_timestamp() is volatile: a bare one is only a
	// filter, so the read goes through every entry of the index's status
	// before or after now (a claim with fewer rows due than its limit read
	// every scheduled event), while a subquery is evaluated once and
	// bounds the index scan.
	boundNow bool
	// nowPlus returns the SQL for now plus a bound number of microseconds.
	nowPlus string
	// nowMinus returns the SQL for now minus a bound number of microseconds.
	nowMinus string
	// lock is appended to the claim's SELECT.
	lock string
	// quote quotes an identifier.
	quote func(string) string
	// bind is sqlx's placeholder style for the dialect.
	bind int
	// retryable reports a transient error worth retrying: a deadlock, a
	// lock-wait timeout, a busy database.
	retryable func(error) bool
	// missingTable reports an error saying the table does not exist.
	missingTable func(error) bool
	// duplicateID reports an INSERT refused by the outbox table's primary
	// key (an event with the id exists).
	duplicateID func(error) bool
	// checkConn, if set, checks at Migrate that the connection is set up
	// for concurrent use.
	checkConn func(ctx context.Context, conn *sql.Conn) error
	// timeArg converts a time to a bound value for a time column.
	timeArg func(time.Time) any
	// readCommitted is set on the claim's transaction.
	readCommitted bool
	// writeTx runs each of the engine's other writes in a READ COMMITTED
	// transaction of its own (MySQL/MariaDB, whose default REPEATABLE READ
	// would take gap locks that block the application's INSERTs).
	writeTx bool
	// byID follows the table name in UPDATEs that name their rows by
	// primary key: with many ids in IN (…), MySQL's optimizer may prefer
	// the status index and lock every row it scans.
	byID string
	// migrationLock and migrationUnlock serialise Migrate across processes.
	migrationLock, migrationUnlock string
	// lockTimeout: migrationLock takes a timeout in seconds and answers 1
	// when it got the lock (MySQL's GET_LOCK).
	lockTimeout bool
	// claimCursor: claims of NEW rows resume after the last row the
	// instance claimed (see claimCursor in claim.go). InnoDB keeps the
	// (status, available_at) entries of delivered rows, delete-marked,
	// until its purge thread removes them; a claim that starts at the
	// front of the index walks over all of them, and while a backlog
	// drains it got slower with every batch (0.9 ms → 12 ms for 200
	// rows). PostgreSQL marks dead index entries on the first scan that
	// meets them, so its claims stay flat without a cursor.
	claimCursor bool
	// rowLock follows a SELECT that locks the rows it reads until the
	// transaction ends (lockEvents); empty where a write transaction
	// holds the whole database (SQLite).
	rowLock string
	// byIDStatus is the status column in the WHERE of writes that name
	// their rows by id. PostgreSQL's generic plan for such a prepared
	// statement (pgx prepares every statement; the sixth run of one gets
	// it) prefers the (status, available_at) index when few rows are due
	// and then reads every due entry per write; "status + 0" is no index's
	// key, which leaves it the primary key (MySQL has FORCE INDEX).
	byIDStatus string
	// idArray binds the ids of a by-id write as one array (see idIn).
	idArray bool
	// findFirst: a claim finds its rows with plain reads outside any
	// transaction, then locks them by primary key (claimFound). InnoDB's
	// locking read over the (status, available_at) index locks every
	// entry it examines, those it rejects too (the events other
	// instances hold leased), and keeps the locks on the index entries
	// until the claim commits: with 50 instances claiming every 50 ms,
	// the DONE writes and lease renewals of those events waited behind
	// one claim after another (DONE p99 2.4 s, 1,173 locks held by one
	// claim of at most 200 rows). PostgreSQL locks only the rows it
	// returns.
	findFirst bool
	// claimPlan, if set, runs first in a claim's transaction: PostgreSQL's
	// planner settings for the claim's SELECTs (see docs/design/
	// claim-plans.md). Each takes the first due rows of one status in
	// available_at order with a LIMIT, which the (status, available_at)
	// index gives without a sort. With statistics that say few rows are
	// due (not gathered since a backlog built up, autovacuum off or
	// behind) the planner preferred a bitmap scan of every due row and a
	// sort of them all: 180 ms per claim with 200,000 pending, against
	// 1 ms by the index. A partial index on the due rows did not change
	// that (its estimate is as small). With sorts off the index is the
	// only plan without one, whatever the statistics; JIT is off so that
	// a plan that must sort anyway (costed with the planner's penalty
	// for a disabled node) is not compiled.
	claimPlan string
	// forceDue: a claim's reads of due rows name the due index (FORCE
	// INDEX, see Store.dueIndex), so that MySQL/MariaDB's optimizer does
	// not weigh it against other plans by its estimates.
	forceDue bool
}

// statusByID returns the status column for the WHERE of by-id writes.
func (d *Dialect) statusByID() string {
	if d.byIDStatus != "" {
		return d.byIDStatus
	}
	return "status"
}

// bound returns expr, a time computed from now, as the bound of an index
// range (see boundNow).
func (d *Dialect) bound(expr string) string {
	if d.boundNow {
		return "(SELECT " + expr + ")"
	}
	return expr
}

// Name returns the dialect's name: "mysql", "postgres" or "sqlite".
func (d *Dialect) Name() string { return d.name }

func (d *Dialect) String() string { return d.name }

var (
	// MySQL is MySQL 8.0+ and MariaDB 10.6+: claims use FOR UPDATE SKIP
	// LOCKED in short READ COMMITTED transactions, times are UTC
	// DATETIME(6) from the server's clock. Use the go-sql-driver/mysql
	// DSN option interpolateParams=true for throughput.
	MySQL = &Dialect{
		name:            "mysql",
		now:             "UTC_TIMESTAMP(6)",
		nowPlus:         "(UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
		nowMinus:        "(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)",
		lock:            " FOR UPDATE SKIP LOCKED",
		rowLock:         " FOR UPDATE",
		quote:           func(s string) string { return "`" + s + "`" },
		bind:            sqlx.QUESTION,
		retryable:       func(err error) bool { return mysqlErr(err, 1213, 1205) }, // deadlock, lock wait timeout
		missingTable:    func(err error) bool { return mysqlErr(err, 1146) },
		duplicateID:     func(err error) bool { return mysqlErr(err, 1062) && strings.Contains(err.Error(), "'PRIMARY'") },
		timeArg:         func(t time.Time) any { return t.UTC() },
		readCommitted:   true,
		writeTx:         true,
		byID:            " FORCE INDEX (PRIMARY)",
		claimCursor:     true,
		findFirst:       true,
		forceDue:        true,
		migrationLock:   "SELECT GET_LOCK(?, ?)",
		lockTimeout:     true,
		migrationUnlock: "SELECT RELEASE_LOCK(?)",
	}
	// Postgres is PostgreSQL 13+: claims use FOR UPDATE SKIP LOCKED, times
	// are TIMESTAMPTZ from the server's clock.
	Postgres = &Dialect{
		name:            "postgres",
		now:             "clock_timestamp()",
		boundNow:        true,
		nowPlus:         "(clock_timestamp() + ? * INTERVAL '1 microsecond')",
		nowMinus:        "(clock_timestamp() - ? * INTERVAL '1 microsecond')",
		lock:            " FOR UPDATE SKIP LOCKED",
		rowLock:         " FOR UPDATE",
		quote:           func(s string) string { return `"` + s + `"` },
		bind:            sqlx.DOLLAR,
		retryable:       func(err error) bool { return sqlState(err, "40001", "40P01", "55P03") },
		missingTable:    func(err error) bool { return sqlState(err, "42P01") },
		duplicateID:     func(err error) bool { return sqlState(err, "23505") && strings.Contains(err.Error(), `_pkey"`) },
		timeArg:         func(t time.Time) any { return t.UTC() },
		readCommitted:   true,
		migrationLock:   "SELECT pg_advisory_lock(hashtext(?))",
		migrationUnlock: "SELECT pg_advisory_unlock(hashtext(?))",
		byIDStatus:      "(status + 0)",
		idArray:         true,
		claimPlan:       "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)",
	}
	// SQLite is SQLite 3.42+ through modernc.org/sqlite, for one process:
	// open it with the DSN from SQLiteDSN (immediate transactions, WAL, a
	// busy timeout). Times are integer microseconds since the epoch.
	SQLite = &Dialect{
		name:     "sqlite",
		now:      sqliteNow,
		nowPlus:  "(" + sqliteNow + " + ?)",
		nowMinus: "(" + sqliteNow + " - ?)",
		quote:    func(s string) string { return `"` + s + `"` },
		bind:     sqlx.QUESTION,
		retryable: func(err error) bool {
			c, ok := sqliteCode(err)
			return ok && (c == 5 || c == 6) // SQLITE_BUSY, SQLITE_LOCKED
		},
		missingTable: func(err error) bool { return err != nil && strings.Contains(err.Error(), "no such table") },
		duplicateID: func(err error) bool {
			var se interface{ Code() int }
			return errors.As(err, &se) && se.Code() == 1555 // SQLITE_CONSTRAINT_PRIMARYKEY
		},
		checkConn: checkSQLite,
		timeArg:   func(t time.Time) any { return t.UnixMicro() },
	}
)

func mysqlErr(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	for _, n := range numbers {
		if me.Number == n {
			return true
		}
	}
	return false
}

func sqlState(err error, states ...string) bool {
	var pe interface{ SQLState() string }
	if !errors.As(err, &pe) {
		return false
	}
	for _, s := range states {
		if pe.SQLState() == s {
			return true
		}
	}
	return false
}

func sqliteCode(err error) (int, bool) {
	var se interface{ Code() int }
	if !errors.As(err, &se) {
		return 0, false
	}
	return se.Code() & 0xff, true
}

// checkSQLite refuses a SQLite database opened without a busy timeout:
// every transaction that meets another writer would then fail at once with
// SQLITE_BUSY ("database is locked") instead of waiting its turn.
func checkSQLite(ctx context.Context, conn *sql.Conn) error {
	var timeout int
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&timeout); err != nil {
		return fmt.Errorf("sqlstore: check the SQLite connection: %w", err)
	}
	if timeout == 0 {
		return errors.New("sqlstore: SQLite is open without a busy timeout, so concurrent transactions fail with \"database is locked\" (SQLITE_BUSY); open it with sqlx.Open(\"sqlite\", sqlstore.SQLiteDSN(path)), which sets a busy timeout, WAL and immediate transactions")
	}
	return nil
}

const sqliteNow = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"

// dialectFor infers the dialect from a database/sql driver name.
func dialectFor(driver string) (*Dialect, error) {
	switch driver {
	case "mysql":
		return MySQL, nil
	case "postgres", "pgx", "pgx/v5", "pgx/v4":
		return Postgres, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	}
	return nil, fmt.Errorf("sqlstore: cannot tell the dialect of driver %q; set Options.Dialect", driver)
}

// SQLiteDSN returns the recommended modernc.org/sqlite DSN for the file at
// path: immediate transactions (so concurrent writers queue instead of
// failing with "database is locked"), WAL journal, a 5 s busy timeout and
// foreign keys on. Import modernc.org/sqlite for the "sqlite" driver.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_txlock=immediate&_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
}
