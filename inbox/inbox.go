package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Defaults of Config.
const (
	DefaultTable        = "outbox_event" // sqlstore.DefaultTable
	DefaultMaxAttempts  = 5
	DefaultRetention    = 7 * 24 * time.Hour
	DefaultCleanupBatch = 1000
	DefaultMaxPayload   = 4 << 20
)

// Config configures an Inbox. The zero value, but for Dialect, means the
// defaults.
type Config struct {
	// Dialect is the database's: MySQL, Postgres or SQLite. Required.
	Dialect *Dialect
	// Table is the outbox table's name (schema.table allowed), as given to
	// sqlstore.Options.Table; the inbox uses <Table>_inbox and
	// <Table>_inbox_failures, which sqlstore's Migrate creates. Defaults
	// to DefaultTable.
	Table string
	// MaxAttempts is the number of failed attempts after which a message
	// is parked. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Retention is how long the rows of applied and purged messages are
	// kept for dedupe; Cleanup deletes older ones. It must exceed the
	// broker's redelivery horizon: a message redelivered after its row
	// was deleted is applied again. Defaults to DefaultRetention.
	Retention time.Duration
	// CleanupBatch is the number of rows one DELETE of Cleanup removes.
	// Defaults to DefaultCleanupBatch.
	CleanupBatch int
	// MaxPayload is the largest payload in bytes Handle accepts; a larger
	// one is Rejected with ErrTooLarge. Defaults to DefaultMaxPayload.
	MaxPayload int
	// Begin begins the handler's transaction. Pass txmw.Begin(db),
	// gormoutbox.Begin(db) or entoutbox's BeginFunc to use their
	// transactions (the handler then reads it with their accessor).
	// Defaults to a database/sql transaction on the Inbox's db (Tx reads
	// it).
	Begin middleware.BeginFunc
	// Observe, if set, is called after each Handle and Replay, for
	// metrics.
	Observe func(Observation)
	// Logger gets a line per parked message and per failure to record a
	// failure, never payloads. Defaults to slog.Default().
	Logger *slog.Logger
}

// Observation is what Config.Observe gets.
type Observation struct {
	Consumer  string
	MessageID string
	Result    Result
	Duration  time.Duration // of the whole Handle, handler included
	Err       error
}

// Message is a received message.
type Message struct {
	// ID identifies the message across redeliveries: the producer's id
	// (the txoutbox-id header of our connectors, Nats-Msg-Id, AMQP
	// message-id, webhook-id), or DeriveID of broker coordinates.
	ID      string
	Payload []byte
	Headers map[string]string
}

// Handler applies a message. ctx carries the transaction: outbox.Publish(ctx,
// env) writes in it, and Tx(ctx) (or the accessor of Config.Begin's
// library) returns it. A returned error or a panic rolls everything back.
type Handler func(ctx context.Context, m Message) error

// Result is what became of a message.
type Result int

// The results of Handle.
const (
	// Applied: the handler's transaction committed with the inbox row.
	Applied Result = iota + 1
	// Duplicate: the message was applied, parked or purged before; the
	// handler was not called.
	Duplicate
	// Failed: nothing was written; let the broker redeliver it (or retry
	// after a back-off).
	Failed
	// Parked: the message failed MaxAttempts times and is kept as a dead
	// inbox entry; settle it at the broker.
	Parked
	// Rejected: the message is unusable as it is (no id, too large); no
	// redelivery can fix it. Refuse it at the broker.
	Rejected
)

var resultNames = [...]string{"", "applied", "duplicate", "failed", "parked", "rejected"}

func (r Result) String() string {
	if r > 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("result(%d)", int(r))
}

// Settled reports whether the broker should be acked: Applied, Duplicate
// and Parked. After Failed it should redeliver; Rejected is the
// consumer's choice (terminate, dead-letter), never a redelivery.
func (r Result) Settled() bool { return r == Applied || r == Duplicate || r == Parked }

// Errors.
var (
	// ErrNoID is the error of a message without an id.
	ErrNoID = errors.New("inbox: message has no id: set Message.ID from the producer's id (the txoutbox-id header, Nats-Msg-Id, message-id, webhook-id), or derive one from broker coordinates that are stable across redelivery with inbox.DeriveID")
	// ErrTooLarge is the error of a payload over Config.MaxPayload.
	ErrTooLarge = errors.New("inbox: payload is larger than Config.MaxPayload")
	// ErrNotParked is the error of Replay for a message that is not parked.
	ErrNotParked = errors.New("inbox: no parked message with this consumer and id")
)

// PanicError is the error of a handler that panicked.
type PanicError struct{ Value any }

func (e *PanicError) Error() string { return fmt.Sprintf("inbox: handler panicked: %v", e.Value) }

// Inbox applies received messages once. It is safe for concurrent use.
type Inbox struct {
	db    *sql.DB
	d     *Dialect
	cfg   Config
	begin middleware.BeginFunc
	log   *slog.Logger
	inbox string // quoted
	fails string // quoted
	// schema ("" for the current one) and name of the inbox table.
	schema, name string
	q            queries
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns an Inbox on db. It does not touch the database: the tables
// come from sqlstore.Store.Migrate (or the SQL in migrations/, file
// 006_inbox.sql).
func New(db *sql.DB, cfg Config) (*Inbox, error) {
	if db == nil {
		return nil, errors.New("inbox: New: db is nil")
	}
	if cfg.Dialect == nil {
		return nil, errors.New("inbox: Config.Dialect is nil: set inbox.MySQL, inbox.Postgres or inbox.SQLite (or inbox.DialectNamed(store.Dialect().Name()))")
	}
	switch {
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("inbox: Config.MaxAttempts %d is negative; 0 means %d", cfg.MaxAttempts, DefaultMaxAttempts)
	case cfg.Retention < 0:
		return nil, fmt.Errorf("inbox: Config.Retention %v is negative; 0 means %v", cfg.Retention, DefaultRetention)
	case cfg.CleanupBatch < 0 || cfg.MaxPayload < 0:
		return nil, errors.New("inbox: Config.CleanupBatch and MaxPayload must not be negative; 0 means the default")
	}
	cfg.Table = cmp.Or(cfg.Table, DefaultTable)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.CleanupBatch = cmp.Or(cfg.CleanupBatch, DefaultCleanupBatch)
	cfg.MaxPayload = cmp.Or(cfg.MaxPayload, DefaultMaxPayload)
	parts := strings.Split(cfg.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("inbox: Config.Table %q: at most one dot (schema.table)", cfg.Table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("inbox: Config.Table %q: each part must be 1-63 letters, digits or underscores, not starting with a digit", cfg.Table)
		}
	}
	ib := &Inbox{db: db, d: cfg.Dialect, cfg: cfg, begin: cfg.Begin, log: cmp.Or(cfg.Logger, slog.Default())}
	name := func(suffix string) string {
		q := make([]string, len(parts))
		for i, p := range parts {
			q[i] = cfg.Dialect.quote(p)
		}
		q[len(q)-1] = cfg.Dialect.quote(parts[len(parts)-1] + suffix)
		return strings.Join(q, ".")
	}
	ib.inbox, ib.fails = name("_inbox"), name("_inbox_failures")
	ib.name = parts[len(parts)-1] + "_inbox"
	if len(parts) == 2 {
		ib.schema = parts[0]
	}
	if ib.begin == nil {
		ib.begin = func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
			return outbox.BeginTx(ctx, db, opts)
		}
	}
	ib.q = buildQueries(cfg.Dialect, ib.inbox, ib.fails)
	return ib, nil
}

// Tables returns the quoted names of the inbox's tables.
func (ib *Inbox) Tables() []string { return []string{ib.inbox, ib.fails} }

// TxFrom returns the database/sql transaction of the handler that ctx
// belongs to, when Config.Begin is the default.
func TxFrom(ctx context.Context) (*sql.Tx, bool) {
	t, ok := txctx.From(ctx)
	if !ok {
		return nil, false
	}
	ot, ok := t.(*outbox.Tx)
	if !ok {
		return nil, false
	}
	return ot.Tx, true
}

// Tx returns the database/sql transaction of the handler that ctx belongs
// to. It panics if there is none: with Config.Begin set, use the accessor
// of that library (txmw.Tx, gormoutbox.DB, …).
func Tx(ctx context.Context) *sql.Tx {
	if tx, ok := TxFrom(ctx); ok {
		return tx
	}
	if t, ok := txctx.From(ctx); ok {
		panic(fmt.Sprintf("inbox: Tx: the context carries a %T, not a database/sql transaction of the inbox; use the accessor of the library Config.Begin comes from", t))
	}
	panic("inbox: Tx: no transaction in context; call it inside an inbox Handler")
}
