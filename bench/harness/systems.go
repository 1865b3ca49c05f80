package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

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
	Rec    *Recorder
	Prefix string // unique table-name prefix of this run
	Orders string // quoted name of the orders table
}

// ordersDDL is the business table every system writes one row to.
const ordersDDL = `CREATE TABLE %s (
  id          BIGINT      NOT NULL PRIMARY KEY,
  customer_id VARCHAR(32) NOT NULL,
  total_cents BIGINT      NOT NULL,
  status      VARCHAR(16) NOT NULL,
  created_at  DATETIME(6) NOT NULL
) ENGINE=InnoDB`

const insertOrder = `INSERT INTO %s (id, customer_id, total_cents, status, created_at) VALUES (?, ?, ?, 'placed', UTC_TIMESTAMP(6))`

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

func quote(name string) string { return "`" + name + "`" }

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

// Raw is the database limit: the same transaction in plain SQL, with the
// same outbox row txoutbox writes (WithOutbox) or with the order alone.
type Raw struct {
	WithOutbox bool

	env    *Env
	table  string
	qOrder string
	qEvent string
}

func (s *Raw) Name() string {
	if s.WithOutbox {
		return "raw SQL: order + outbox row"
	}
	return "raw SQL: order only"
}

func (s *Raw) Delivers() bool { return false }

func (s *Raw) Setup(ctx context.Context, env *Env) error {
	s.env = env
	s.qOrder = fmt.Sprintf(insertOrder, env.Orders)
	if !s.WithOutbox {
		return nil
	}
	store, err := newStore(ctx, env.DB, env.Prefix+"_rawob")
	if err != nil {
		return err
	}
	s.table = store.Table()
	s.qEvent = rawInsert(s.table)
	return nil
}

// rawInsert is the INSERT sqlstore issues for one event, verbatim.
func rawInsert(table string) string {
	return `INSERT INTO ` + table + ` (id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at, locked_by, locked_until)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ?, (UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND))`
}

func (s *Raw) Tx(ctx context.Context, seq int64, payload []byte) error {
	tx, err := s.env.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.qOrder, orderArgs(seq)...); err != nil {
		return err
	}
	if s.WithOutbox {
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
	if s.table == "" {
		return nil
	}
	return dropTables(ctx, s.env.DB, s.table, schemaTable(s.table))
}

// schemaTable is sqlstore's migrations table for a quoted table name.
func schemaTable(quoted string) string { return quoted[:len(quoted)-1] + "_schema`" }
