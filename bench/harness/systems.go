package harness

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/oklog/ulid/v2"

	"github.com/txoutbox/txoutbox/outbox"
)

// System is one way of running the business transaction and (if it
// delivers) of getting its event to a listener.
type System interface {
	// Name is the row label in the report.
	Name() string
	// Delivers reports whether events reach a listener (raw SQL does not).
	Delivers() bool
	// Setup creates the system's tables (prefixed with prefix, next to the
	// orders table env.Orders) and starts its consumer, which must call
	// rec.Delivered for each event received.
	Setup(ctx context.Context, env *Env) error
	// Tx runs one business transaction for event seq: INSERT the order,
	// publish payload, COMMIT. It calls env.Rec.Committed(seq) at commit
	// time (just before the commit returns).
	Tx(ctx context.Context, seq int64, payload []byte) error
	// Teardown stops the consumer and drops the system's tables.
	Teardown(ctx context.Context) error
}

// Env is what a system gets for one run.
type Env struct {
	DB     *sqlx.DB
	D      *Dialect // the database's dialect; nil: from DB's driver
	Rec    *Recorder
	Prefix string // unique table-name prefix of this run
	Orders string // quoted name of the orders table
}

// dialect returns the run's dialect.
func (e *Env) dialect() *Dialect {
	if e.D == nil {
		e.D = dialectOf(e.DB)
	}
	return e.D
}

func orderArgs(seq int64) []any {
	return []any{seq, "cust-" + strconv.FormatInt(seq%100000, 10), 1999 + seq%5000}
}

// Payload returns the ~200-byte JSON event of order seq.
func Payload(seq int64) []byte {
	return fmt.Appendf(nil, `{"order_id":%d,"customer_id":"cust-%06d","currency":"EUR","total_cents":%d,`+
		`"items":[{"sku":"SKU-%05d","qty":%d,"price_cents":%d},{"sku":"SKU-%05d","qty":1,"price_cents":499}],"placed_at":"%s"}`,
		seq, seq%100000, 1999+seq%5000, seq%10000, 1+seq%3, 1500+seq%500, (seq+7)%10000,
		time.Unix(1_780_000_000+seq, 0).UTC().Format(time.RFC3339))
}

// seqOf parses an event number carried as a decimal string.
func seqOf(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func dropTables(ctx context.Context, db *sqlx.DB, quoted ...string) error {
	var errs []string
	for _, t := range quoted {
		if _, err := db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+t); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("harness: drop tables: %s", strings.Join(errs, "; "))
	}
	return nil
}

// --- raw SQL ---

// RawRow is which outbox row a Raw transaction writes besides the order.
type RawRow int

const (
	// RawNone writes the order alone.
	RawNone RawRow = iota
	// RawMinimal writes a minimal outbox row: ULID bytes id, type,
	// aggregate id, JSON payload, created-at, one secondary index.
	RawMinimal
	// RawSqlstore writes sqlstore's exact INSERT into its migrated table.
	RawSqlstore
)

// Raw is the database limit: the same transaction in plain SQL, with a
// minimal outbox row, with the row txoutbox writes, or with the order
// alone.
type Raw struct {
	Row RawRow

	env    *Env
	tables []string
	qOrder string
	qEvent string
}

// Names of the raw systems; RawLimitName is the reference of the ratios.
var (
	RawLimitName    = (&Raw{Row: RawMinimal}).Name()
	RawSqlstoreName = (&Raw{Row: RawSqlstore}).Name()
)

func (s *Raw) Name() string {
	switch s.Row {
	case RawMinimal:
		return "raw SQL: order + minimal outbox row"
	case RawSqlstore:
		return "raw SQL: order + sqlstore's outbox row"
	}
	return "raw SQL: order only"
}

func (s *Raw) Delivers() bool { return false }

func (s *Raw) Setup(ctx context.Context, env *Env) error {
	s.env = env
	s.qOrder = insertOrderSQL(env.DB, env.Orders)
	switch s.Row {
	case RawMinimal:
		t := env.dialect().Quote(env.Prefix + "_min")
		s.tables = []string{t}
		if err := createMinimal(ctx, env.DB, t, env.Prefix+"_min"); err != nil {
			return err
		}
		s.qEvent = minimalInsert(env.DB, t)
	case RawSqlstore:
		store, err := newStore(ctx, env.DB, env.Prefix+"_rawob")
		if err != nil {
			return err
		}
		s.tables = storeTables(store)
		s.qEvent = rawInsert(env.DB, store.Table())
	}
	return nil
}

// minimalInsert is the INSERT of one minimal outbox row.
func minimalInsert(db *sqlx.DB, table string) string {
	return db.Rebind(`INSERT INTO ` + table + ` (id, event_type, aggregate_id, payload, created_at) VALUES (?, 'OrderPlaced', ?, ?, ` + dialectOf(db).Now + `)`)
}

// rawInsert is the INSERT sqlstore issues for one event, verbatim.
func rawInsert(db *sqlx.DB, table string) string {
	d := dialectOf(db)
	return db.Rebind(`INSERT INTO ` + table + ` (id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at, locked_by, locked_until)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ` + d.Now + `, ` + d.Now + `, ?, ` + d.NowPlusMicros + `)`)
}

// minimalRow is the minimal outbox row's arguments: a client-side ULID as
// 16 bytes, the aggregate id and the payload.
func minimalRow(seq int64, payload []byte) []any {
	id := ulid.Make()
	return []any{id[:], strconv.FormatInt(seq, 10), payload}
}

// beginOrder begins a transaction on db and inserts into it the order
// row of seq with q; the caller ends it.
func beginOrder(ctx context.Context, db *sqlx.DB, q string, seq int64) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, q, orderArgs(seq)...); err != nil {
		tx.Rollback()
		return nil, err
	}
	return tx, nil
}

func (s *Raw) Tx(ctx context.Context, seq int64, payload []byte) error {
	tx, err := beginOrder(ctx, s.env.DB, s.qOrder, seq)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	switch s.Row {
	case RawMinimal:
		if _, err := tx.ExecContext(ctx, s.qEvent, minimalRow(seq, payload)...); err != nil {
			return err
		}
	case RawSqlstore:
		if _, err := tx.ExecContext(ctx, s.qEvent, outbox.NewID(), "OrderPlaced", "order", strconv.FormatInt(seq, 10), "", nil,
			payload, true, time.Now().UTC(), "raw", int64(30e6)); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.env.Rec.Committed(seq)
	return nil
}

func (s *Raw) Teardown(ctx context.Context) error {
	if len(s.tables) == 0 {
		return nil
	}
	return dropTables(ctx, s.env.DB, s.tables...)
}
