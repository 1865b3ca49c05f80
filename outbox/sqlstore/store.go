package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// DefaultTable is the table name used when Options.Table is empty.
const DefaultTable = "outbox_event"

// Options configure a Store.
type Options struct {
	// Dialect is the database's SQL dialect. Defaults to the one matching
	// the driver name of the *sqlx.DB.
	Dialect *Dialect
	// Table is the outbox table's name, optionally qualified with a schema
	// ("app.outbox_event"). Letters, digits and underscores only; it is
	// quoted, never taken from request data. Defaults to "outbox_event".
	Table string
	// DeleteDelivered deletes an event once it is delivered, instead of
	// marking it DONE for Cleanup to delete after Config.Retention. Each
	// event then costs the database one write less on the way (an UPDATE of
	// the row and its status index entry, then a DELETE, become one DELETE;
	// see BENCHMARKS.md), and the table holds only what is still owed. The
	// price is the history: Inspect (and the admin's event page) no longer
	// finds a delivered event, and Stats counts no DONE rows. Dead letters,
	// retries and the per-subscription rows of events that failed somewhere
	// are kept as before.
	DeleteDelivered bool
	// ArchiveDelivered moves an event, once it is delivered, into the
	// archive table <table>_archive (Store.ArchiveTable), with when
	// (delivered_at, on the database's clock) and by which instance
	// (delivered_by) it was delivered, instead of marking it DONE: the
	// copy and the removal commit together, in the transaction that
	// completes the event. The table then holds only what is still owed,
	// as with DeleteDelivered, and the archive keeps the history for
	// audit: Inspect finds an archived event there, SearchArchive (outboxctl
	// archive search, the admin's Archive page) finds events by id, type
	// or aggregate, and Config.ArchiveRetention (CleanupArchive) deletes
	// it in the end. Each completion costs an INSERT … SELECT more than
	// DeleteDelivered (see BENCHMARKS.md). Events that are DONE without
	// being delivered (Cancel, SkipDead) stay DONE in the table. Not with
	// DeleteDelivered.
	ArchiveDelivered bool
	// AllowUnsupportedServer lets Migrate go on where CheckServer refuses
	// the server (TiDB, Vitess, MariaDB before 10.6, …; see CheckServer
	// and docs/databases.md). The store does not work as documented
	// there: set it only to try a server out, never where events matter.
	AllowUnsupportedServer bool
}

// Store is an driver.Store over a SQL database. It is safe for concurrent
// use.
type Store struct {
	db    *sqlx.DB
	d     *Dialect
	table string // quoted
	name  string // bare, for index and lock names
	// schema is the schema (MySQL: database) Options.Table names, or "";
	// see lockName.
	schema string
	q      queries
	del    bool // Options.DeleteDelivered
	arch   bool // Options.ArchiveDelivered

	mu      sync.Mutex
	cursors map[string]claimCursor // by claiming owner; see claimCursor
	// claimSets are the claim's SELECTs by type filter (claimSetOf).
	claimSets map[string]claimSet

	known knownKeys // MySQL: ordering keys whose row is committed; see createKey
	maker keyMaker  // MySQL: makes the rows of new keys; see createKey
	gates keyGates  // MySQL: new keys whose row a transaction of the process is inserting

	srv serverFlavor // MySQL dialect: MariaDB or MySQL; see bounded

	anyServer bool // Options.AllowUnsupportedServer
}

var (
	_ driver.Store           = (*Store)(nil)
	_ driver.StatsReader     = (*Store)(nil)
	_ driver.DeadLetterStore = (*Store)(nil)
	_ driver.Cleaner         = (*Store)(nil)
	_ driver.BatchInserter   = (*Store)(nil)
	_ driver.OnceInserter    = (*Store)(nil)
	_ driver.Scheduler       = (*Store)(nil)
	_ driver.Inspector       = (*Store)(nil)
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a Store on db. It fails on an unknown driver or a bad table
// name; it does not touch the database (see Migrate).
func New(db *sqlx.DB, opts Options) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlstore: New: db is nil")
	}
	if opts.DeleteDelivered && opts.ArchiveDelivered {
		return nil, errors.New("sqlstore: New: Options.DeleteDelivered and Options.ArchiveDelivered are both set; a delivered event is either deleted or archived: set one of them")
	}
	d := opts.Dialect
	if d == nil {
		var err error
		if d, err = dialectFor(db.DriverName()); err != nil {
			return nil, err
		}
	}
	table := opts.Table
	if table == "" {
		table = DefaultTable
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("sqlstore: Options.Table %q: at most one dot (schema.table)", table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("sqlstore: Options.Table %q: each part must be 1-63 letters, digits or underscores, not starting with a digit", table)
		}
	}
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = d.quote(p)
	}
	s := &Store{db: db, d: d, table: strings.Join(quoted, "."), name: parts[len(parts)-1], del: opts.DeleteDelivered, arch: opts.ArchiveDelivered,
		cursors: make(map[string]claimCursor), claimSets: map[string]claimSet{}, anyServer: opts.AllowUnsupportedServer}
	if len(parts) == 2 {
		s.schema = parts[0]
	}
	s.q = s.buildQueries()
	return s, nil
}

// poolFull reports whether every connection of a pool with a limit is in
// use: a wait for one may then wait for a transaction that waits for us.
func poolFull(st sql.DBStats) bool {
	return st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections
}

// Must is New that panics on error, for package-level setup.
func Must(s *Store, err error) *Store {
	if err != nil {
		panic(err)
	}
	return s
}

// DB returns the database the store polls.
func (s *Store) DB() *sqlx.DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() *Dialect { return s.d }

// Table returns the quoted table name.
func (s *Store) Table() string { return s.table }

type queries struct {
	inspect, insert, markRetry, markDead, stats, listDead, cleanup string
	claim                                                          claimSet // without a type filter
	insertHead, insertValues                                       string   // unbound
	// update is "UPDATE <table>" with the dialect's hint to look rows up by
	// primary key (see Dialect.byID).
	update string
}

// rebind writes q's placeholders the dialect's way (not the driver name's:
// a wrapped driver such as "otel-pgx" is unknown to sqlx).
func (s *Store) rebind(q string) string { return sqlx.Rebind(s.d.bind, q) }

// explain adds what to do to an error of the table itself.
// IsMissingTable reports whether err (or an error it wraps) is the
// database saying that a table does not exist: MySQL/MariaDB error 1146,
// PostgreSQL SQLSTATE 42P01, SQLite "no such table". Tools use it to tell
// an operator to run the migrations (outboxctl migrate up).
func (s *Store) IsMissingTable(err error) bool { return err != nil && s.d.missingTable(err) }

func (s *Store) explain(err error) error {
	if err != nil && s.d.missingTable(err) {
		return fmt.Errorf("%w (the outbox table %s does not exist: call Store.Migrate at start, or apply the SQL in migrations/%s)", err, s.table, s.d.name)
	}
	return err
}

func (s *Store) buildQueries() queries {
	d, t := s.d, s.table
	// The INSERT's head and one row of its VALUES, unbound: InsertBatch
	// repeats the row and rebinds the whole.
	insertHead := `INSERT INTO ` + t + ` (id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at, locked_by, locked_until, ordering_key)
VALUES `
	insertValues := `(?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ` + d.now + `, ` + d.now + `, ?, ` + d.nowPlus + `, ?)`
	update := `UPDATE ` + t + d.byID
	return queries{
		update:       update,
		inspect:      s.rebind(`SELECT ` + rowColumns + `, COALESCE(last_error, '') FROM ` + t + ` WHERE id = ?`),
		insert:       s.rebind(insertHead + insertValues),
		insertHead:   insertHead,
		insertValues: insertValues,
		claim:        s.buildClaimSet(""),
		markRetry: s.rebind(update + ` SET status = 2, attempts = attempts + 1, available_at = ` + d.nowPlus + `, last_error = ?, locked_by = NULL, locked_until = NULL
WHERE id = ? AND locked_by = ? AND status IN (0, 2)`),
		markDead: s.rebind(update + ` SET status = 3, attempts = attempts + 1, done_at = ` + d.now + `, last_error = ?, locked_by = NULL, locked_until = NULL
WHERE id = ? AND locked_by = ? AND status IN (0, 2)`),
		stats:    `SELECT status, COUNT(*) FROM ` + t + ` GROUP BY status`,
		listDead: s.rebind(`SELECT id, event_type, aggregate_type, aggregate_id, tenant_id, attempts, COALESCE(last_error, ''), created_at FROM ` + t + ` WHERE status = 3 AND id > ? ORDER BY id LIMIT ?`),
		cleanup:  s.rebind(`SELECT id FROM ` + t + ` WHERE status IN (?, ?) AND available_at < ` + d.nowMinus + ` ORDER BY available_at LIMIT ?`),
	}
}

// claimSet is a claim's three SELECTs (see claimNewRows), with one type
// filter (driver.ClaimRequest.Types, NotTypes).
type claimSet struct{ retry, new, newAfter string }

// buildClaimSet builds the claim's SELECTs with types, unbound ("" or a
// condition on event_type starting with " AND"), before ORDER BY.
func (s *Store) buildClaimSet(types string) claimSet {
	d := s.d
	cols, lock := rowColumns, d.lock
	if d.findFirst {
		cols, lock = "id", ""
	}
	// One status per SELECT, so that the (status, available_at) index
	// gives the order and the LIMIT stops the scan: with IN (0, 2) the
	// database sorts every due row, and a claim costs time in
	// proportion to the backlog. A NEW row's available_at is its
	// insert time, so SkipRecent is a bound on the same index. Where
	// the dialect finds first (Dialect.findFirst) these are plain
	// reads of ids, and claimLockSQL locks what they found. The plan
	// must not depend on the statistics (a backlog builds up faster than
	// they are gathered): MySQL/MariaDB are told the index (dueIndex),
	// PostgreSQL's claim transaction turns sorts off (Dialect.claimPlan).
	due := s.dueIndex("_due")
	return claimSet{
		new: s.rebind(`SELECT ` + cols + `, available_at FROM ` + s.table + due + `
WHERE status = 0 AND available_at <= ` + d.bound(d.nowMinus) + `
  AND (locked_until IS NULL OR locked_until <= ` + d.now + `) AND key_seq IS NULL` + types + `
ORDER BY available_at` + claimTieBreak(d) + ` LIMIT ?` + lock),
		// new resumed after (available_at, id) of the last row claimed.
		// The index is forced, and the cursor is a bound on available_at
		// alone (the tie broken by a filter): else MariaDB reads the index
		// from the front of status = 0 ("ref"), which is what the cursor
		// is there to avoid.
		newAfter: s.rebind(`SELECT ` + cols + `, available_at FROM ` + s.table + due + `
WHERE status = 0 AND available_at >= ? AND (available_at > ? OR id > ?) AND available_at <= ` + d.bound(d.nowMinus) + `
  AND (locked_until IS NULL OR locked_until <= ` + d.now + `) AND key_seq IS NULL` + types + `
ORDER BY available_at, id LIMIT ?` + lock),
		retry: s.rebind(`SELECT ` + cols + ` FROM ` + s.table + due + `
WHERE status = 2 AND available_at <= ` + d.bound(d.now) + `
  AND (locked_until IS NULL OR locked_until <= ` + d.now + `) AND key_seq IS NULL` + types + `
ORDER BY available_at LIMIT ?` + lock),
	}
}

// dueIndex returns what follows a table name in a claim's read of due
// rows: on MySQL/MariaDB, FORCE INDEX of the table's index named by suffix
// (Dialect.forceDue).
func (s *Store) dueIndex(suffix string) string {
	if !s.d.forceDue {
		return ""
	}
	return ` FORCE INDEX (` + s.d.quote(s.name+suffix) + `)`
}

// nowBound is the dialect's now as the bound of an index range
// (Dialect.boundNow).
func (s *Store) nowBound() string { return s.d.bound(s.d.now) }

// claimSetFor returns the claim's SELECTs for req's type filter, and the
// filter's arguments (bound after the others, before the LIMIT).
func (s *Store) claimSetFor(req driver.ClaimRequest) (claimSet, []any) {
	types, not := req.Types, false
	if types == nil {
		types, not = req.NotTypes, true
		if len(types) == 0 {
			return s.q.claim, nil
		}
	}
	if len(types) == 0 {
		return s.claimSetOf(" AND 1 = 0", "none"), nil
	}
	n := len(types)
	if s.d.idArray {
		n = 1
	}
	cond := " AND event_type" + s.idIn(len(types))
	if not {
		cond = " AND NOT (event_type" + s.idIn(len(types)) + ")"
	}
	return s.claimSetOf(cond, fmt.Sprint(not, n)), s.idArgs(types)
}

// claimSetOf returns the claim's SELECTs with types, built once per key.
func (s *Store) claimSetOf(types, key string) claimSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.claimSets[key]
	if !ok {
		c = s.buildClaimSet(types)
		s.claimSets[key] = c
	}
	return c
}

// claimTieBreak orders the claim's rows of one available_at by id where a
// cursor resumes after them (InnoDB's secondary index holds the primary
// key, so the order costs no sort).
func claimTieBreak(d *Dialect) string {
	if d.claimCursor {
		return ", id"
	}
	return ""
}

// The engine's writes that name n rows by id. Each goes through s.q.update,
// which carries the dialect's primary-key hint: with hundreds of ids on a
// table of a few thousand rows, MariaDB otherwise scans the whole primary
// key (and at REPEATABLE READ would lock all of it).

// claimLockSQL is the locking read of a claim that found its n rows
// first (Dialect.findFirst): by primary key, so that it locks those rows
// only, and with the whole WHERE of the finding reads decided again on
// each row's latest version (another claim may have leased it meanwhile,
// or its owner written it DONE). Its one parameter before the ids is
// SkipRecent in microseconds.
func (s *Store) claimLockSQL(n int) string {
	d := s.d
	return s.rebind(`SELECT ` + rowColumns + ` FROM ` + s.table + d.byID + `
WHERE ((status = 2 AND available_at <= ` + d.now + `) OR (status = 0 AND available_at <= ` + d.nowMinus + `))
  AND (locked_until IS NULL OR locked_until <= ` + d.now + `) AND key_seq IS NULL AND id` + s.idIn(n) + d.lock)
}

func (s *Store) leaseSQL(n int) string {
	return s.rebind(s.q.update + ` SET locked_by = ?, locked_until = ` + s.d.nowPlus + ` WHERE id` + s.idIn(n))
}

// markDoneSQL is the write of MarkDone: an UPDATE to DONE, or with
// DeleteDelivered a DELETE.
func (s *Store) markDoneSQL(n int, fenced bool) string {
	if s.del {
		// No index hint: MySQL's single-table DELETE takes none. It runs
		// at READ COMMITTED (execCount), so a plan that scans the primary
		// key keeps no locks on the rows it passes.
		return s.rebind(`DELETE FROM ` + s.table + ` WHERE locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2) AND id` + s.idIn(n) + s.regFenceIf(fenced))
	}
	return s.markDoneUpdateSQL(n, fenced)
}

// markDoneUpdateSQL is the UPDATE to DONE of n ids, with the registry
// fence if fenced (its version the last argument).
func (s *Store) markDoneUpdateSQL(n int, fenced bool) string {
	return s.rebind(s.q.update + s.setDone() + `
WHERE locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2) AND id` + s.idIn(n) + s.regFenceIf(fenced))
}

func (s *Store) regFenceIf(fenced bool) string {
	if fenced {
		return s.regFence()
	}
	return ""
}

// setDone is the SET clause that makes a row (an event or a delivery)
// DONE now and free.
func (s *Store) setDone() string {
	return ` SET status = 1, done_at = ` + s.d.now + `, locked_by = NULL, locked_until = NULL`
}

// markDoneIn writes ids, leased to owner, DONE through exec (with
// DeleteDelivered: deletes them) if the registry's version is registry,
// and returns how many it changed. It changes nothing if the version is
// another: the caller tells that from a lost lease with registryMoved
// when none changed.
func (s *Store) markDoneIn(ctx context.Context, exec func(ctx context.Context, q string, args ...any) (int, error), owner string, ids []string, registry int64) (int, error) {
	return exec(ctx, s.markDoneSQL(len(ids), true), append(s.idArgs(ids, owner), registry)...)
}

func (s *Store) extendSQL(n int) string {
	return s.rebind(s.q.update + ` SET locked_until = ` + s.d.nowPlus + ` WHERE locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2) AND id` + s.idIn(n))
}

func (s *Store) releaseSQL(n int, delayed bool) string {
	set := ` SET locked_by = NULL, locked_until = NULL`
	if delayed {
		set += `, available_at = ` + s.d.nowPlus
	}
	return s.rebind(s.q.update + set + ` WHERE locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2) AND id` + s.idIn(n))
}

func (s *Store) replaySQL(n int) string {
	// Due at their creation time: claims take the earliest due first, so
	// replayed events go out in publish order.
	return s.rebind(s.q.update + ` SET status = 0, attempts = 0, available_at = created_at, done_at = NULL, locked_by = NULL, locked_until = NULL
WHERE ` + s.d.statusByID() + ` = 3 AND id` + s.idIn(n))
}

// idIn returns the condition on id of a write that names n rows: " IN
// (?, ?, …)", or, on PostgreSQL, " = ANY(?)" with the ids bound as one
// array (idArgs), so that pgx prepares one statement per write instead of
// one per count of ids (up to 500 a connection, each a round trip more).
func (s *Store) idIn(n int) string {
	if s.d.idArray {
		return " = ANY(?)"
	}
	return " IN " + in(n)
}

// idArgs returns prefix followed by the ids the way idIn binds them.
func (s *Store) idArgs(ids []string, prefix ...any) []any {
	if s.d.idArray {
		return append(append(make([]any, 0, len(prefix)+1), prefix...), ids)
	}
	return stringArgs(ids, prefix...)
}

// in returns "(?, ?, …)" with n placeholders.
func in(n int) string {
	return "(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
}

func stringArgs(ids []string, prefix ...any) []any {
	args := make([]any, 0, len(prefix)+len(ids))
	args = append(args, prefix...)
	for _, id := range ids {
		args = append(args, id)
	}
	return args
}

// Insert implements driver.Store. It writes through exec, the caller's
// transaction.
func (s *Store) Insert(ctx context.Context, exec driver.Execer, r *driver.Row, owner string, lease time.Duration) error {
	_, err := exec.ExecContext(ctx, s.q.insert, s.insertArgs(nil, r, owner, lease)...)
	return s.explain(err)
}

// An INSERT of InsertBatch holds at most insertBatchRows rows (12
// parameters a row stay far below every dialect's limit on bound
// parameters) and, past its first row, at most insertBatchBytes of
// payloads and headers (well under MySQL's default max_allowed_packet).
const (
	insertBatchRows  = 500
	insertBatchBytes = 4 << 20
)

// InsertBatch implements driver.BatchInserter: multi-row INSERTs through
// exec, the caller's transaction, of up to 500 rows or 4 MiB each.
func (s *Store) InsertBatch(ctx context.Context, exec driver.Execer, rows []driver.Row, owner string, lease time.Duration) error {
	for len(rows) > 0 {
		n, size := 1, len(rows[0].Payload)+len(rows[0].Headers)
		for n < len(rows) && n < insertBatchRows {
			size += len(rows[n].Payload) + len(rows[n].Headers)
			if size > insertBatchBytes {
				break
			}
			n++
		}
		chunk := rows[:n]
		rows = rows[n:]
		var sb strings.Builder
		sb.WriteString(s.q.insertHead)
		args := make([]any, 0, 12*len(chunk))
		for i := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString(s.q.insertValues)
			args = s.insertArgs(args, &chunk[i], owner, lease)
		}
		if _, err := exec.ExecContext(ctx, s.rebind(sb.String()), args...); err != nil {
			return s.explain(err)
		}
	}
	return nil
}

// insertArgs appends the parameters of one row of the INSERT to args.
func (s *Store) insertArgs(args []any, r *driver.Row, owner string, lease time.Duration) []any {
	var headers any
	if r.Headers != nil {
		headers = string(r.Headers)
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{}
	}
	var lockedBy, leaseArg any // NULL, NULL: free at once
	if owner != "" {
		lockedBy, leaseArg = owner, lease.Microseconds()
	}
	var key any
	if r.OrderingKey != "" {
		key = r.OrderingKey
	}
	return append(args, r.ID, r.Type, r.AggregateType, r.AggregateID, r.TenantID, headers, payload, r.PayloadJSON,
		s.d.timeArg(r.OccurredAt), lockedBy, leaseArg, key)
}

func rollback(tx *sqlx.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("rollback: %w", err)
	}
	return nil
}

// MarkDone implements driver.Store with one UPDATE per call (with
// ArchiveDelivered: the archive's statements in one transaction).
func (s *Store) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	var n int
	var err error
	if s.arch {
		err = s.inTx(ctx, func(tx *sqlx.Tx) error {
			n, err = s.archiveDone(ctx, tx, owner, ids, registry)
			return err
		})
	} else {
		n, err = s.markDoneIn(ctx, s.execCount, owner, ids, registry)
	}
	if err == nil && n == 0 {
		err = s.registryMoved(ctx, s.db, registry)
	}
	if err != nil {
		return n, fmt.Errorf("sqlstore: mark done: %w", err)
	}
	return n, nil
}

// MarkRetry implements driver.Store.
func (s *Store) MarkRetry(ctx context.Context, owner, id string, delay time.Duration, errText string) (bool, error) {
	n, err := s.execCount(ctx, s.q.markRetry, delay.Microseconds(), errText, id, owner)
	return n == 1, err
}

// MarkDead implements driver.Store.
func (s *Store) MarkDead(ctx context.Context, owner, id string, errText string) (bool, error) {
	n, err := s.execCount(ctx, s.q.markDead, errText, id, owner)
	return n == 1, err
}

// ExtendLeases implements driver.Store.
func (s *Store) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	q := s.extendSQL(len(ids))
	return s.execCount(ctx, q, s.idArgs(ids, lease.Microseconds(), owner)...)
}

// Release implements driver.Store.
func (s *Store) Release(ctx context.Context, owner string, ids []string, delay time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	if delay > 0 {
		_, err := s.execCount(ctx, s.releaseSQL(len(ids), true), s.idArgs(ids, delay.Microseconds(), owner)...)
		return err
	}
	_, err := s.execCount(ctx, s.releaseSQL(len(ids), false), s.idArgs(ids, owner)...)
	return err
}

// execCount runs one of the engine's own writes and returns the number of
// rows it changed. On MySQL/MariaDB it runs in a READ COMMITTED transaction
// of its own: at the server's default REPEATABLE READ, an UPDATE takes
// next-key locks on every index record it scans, and a batched write could
// block the application's INSERTs for seconds. Deadlocks, lock-wait
// timeouts and a busy database are retried.
func (s *Store) execCount(ctx context.Context, q string, args ...any) (int, error) {
	var n int64
	err := s.retry(ctx, func() error {
		var res sql.Result
		var err error
		if s.d.writeTx {
			res, err = s.execReadCommitted(ctx, q, args...)
		} else {
			res, err = s.db.ExecContext(ctx, q, args...)
		}
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

func (s *Store) execReadCommitted(ctx context.Context, q string, args ...any) (_ sql.Result, err error) {
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return nil, errors.Join(err, rollback(tx))
	}
	return res, tx.Commit()
}

// retry runs f again after a deadlock, a lock-wait timeout or a busy
// database, up to five times, waiting 5, 10, 20, 40 and 80 ms (±50 %, so
// that the two sides of a deadlock do not collide again).
func (s *Store) retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range 6 {
		if err = f(); err == nil || !s.d.retryable(err) || ctx.Err() != nil || attempt == 5 {
			return err
		}
		t := time.NewTimer(time.Duration(float64(int(5)<<attempt) * (0.5 + rand.Float64()) * float64(time.Millisecond)))
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
	return err
}

// ErrOnceOnPartitioned is returned by InsertOnce (Outbox.PublishOnce) on
// a partitioned MySQL table.
var ErrOnceOnPartitioned = errors.New("sqlstore: PublishOnce: the outbox table is partitioned, and its primary key (id, created_at) does not refuse a reused id (MySQL wants the partitioning column in every unique key): publish with Publish and de-duplicate on the event id downstream (package inbox), or keep the table unpartitioned and use Config.Retention")

// onceSavepoint is the savepoint InsertOnce writes in.
const onceSavepoint = "txoutbox_once"

// InsertOnce implements driver.OnceInserter: insert runs in a savepoint
// of exec's transaction, rolled back if it fails, so that the transaction
// stays usable (PostgreSQL aborts a transaction on any error otherwise);
// a failure of the table's primary key is driver.ErrDuplicateID. A
// concurrent transaction that wrote the id first makes the INSERT wait
// for its outcome (the primary key's lock): refused if it commits,
// written if it rolls back. On a partitioned MySQL table it returns
// ErrOnceOnPartitioned and writes nothing.
func (s *Store) InsertOnce(ctx context.Context, exec driver.Execer, id string, insert func() error) error {
	if s.d == MySQL {
		if partitioned, err := s.partitioned(ctx, exec); err != nil {
			return err
		} else if partitioned {
			return ErrOnceOnPartitioned
		}
	}
	if _, err := exec.ExecContext(ctx, "SAVEPOINT "+onceSavepoint); err != nil {
		return fmt.Errorf("sqlstore: insert event %s once: savepoint: %w", id, err)
	}
	err := insert()
	if err == nil {
		if _, err := exec.ExecContext(ctx, "RELEASE SAVEPOINT "+onceSavepoint); err != nil {
			return fmt.Errorf("sqlstore: insert event %s once: release savepoint: %w", id, err)
		}
		return nil
	}
	if _, rerr := exec.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+onceSavepoint); rerr != nil {
		return errors.Join(err, fmt.Errorf("sqlstore: insert event %s once: roll back to savepoint: %w", id, rerr))
	}
	if _, rerr := exec.ExecContext(ctx, "RELEASE SAVEPOINT "+onceSavepoint); rerr != nil {
		return errors.Join(err, fmt.Errorf("sqlstore: insert event %s once: release savepoint: %w", id, rerr))
	}
	if s.d.duplicateID(err) {
		return driver.ErrDuplicateID
	}
	return err
}

// partitioned reports whether the table is partitioned (MySQL), asked
// through exec if it can answer a query (the caller's transaction holds
// a connection; a pool of one would have none left for another).
func (s *Store) partitioned(ctx context.Context, exec driver.Execer) (bool, error) {
	schema, name := s.schemaAndName()
	q := `SELECT COUNT(*) FROM information_schema.PARTITIONS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND PARTITION_NAME IS NOT NULL`
	var n int
	var err error
	if qr, ok := exec.(rowQuerier); ok {
		err = qr.QueryRowContext(ctx, q, schema, name).Scan(&n)
	} else {
		err = s.db.QueryRowContext(ctx, q, schema, name).Scan(&n)
	}
	if err != nil {
		return false, fmt.Errorf("sqlstore: is the table partitioned: %w", err)
	}
	return n > 0, nil
}
