package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// env is one database with a migrated outbox (and so inbox) table, an
// outbox engine, a business table and an Inbox.
type env struct {
	name  string
	db    *sqlx.DB
	store *sqlstore.Store
	ob    *outbox.Outbox
	ib    *inbox.Inbox
	items string
	calls atomic.Int64 // handler calls of e.apply
}

func setup(t testing.TB, name string, cfg inbox.Config) *env {
	t.Helper()
	db := testdb.Open(t, name)
	store := testdb.Store(t, db)
	e := &env{name: name, db: db, store: store, items: testdb.TableName("items")}
	if _, err := db.Exec("CREATE TABLE " + e.items + " (id VARCHAR(255) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, db, e.items) })
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })
	e.ob = ob
	cfg.Dialect, err = inbox.DialectNamed(store.Dialect().Name())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Table = strings.Trim(store.Table(), "`\"")
	if e.ib, err = inbox.New(db.DB, cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func eachDB(t *testing.T, cfg inbox.Config, fn func(t *testing.T, e *env)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t, name, cfg))
		})
	}
}

// apply is a handler that writes the message's id as a business row and
// publishes an event for it, through the transaction in ctx.
func (e *env) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	if _, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID); err != nil {
		return err
	}
	_, err := outbox.Publish(outbox.NewContext(ctx, e.ob), outbox.Envelope{Type: "item.applied", AggregateID: m.ID, JSON: []byte(`{}`)})
	return err
}

// failing is apply followed by err: its writes must roll back.
func (e *env) failing(err error) inbox.Handler {
	return func(ctx context.Context, m inbox.Message) error {
		if aerr := e.apply(ctx, m); aerr != nil {
			return aerr
		}
		return err
	}
}

func (e *env) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, e.db.Rebind(q), args...); err != nil {
		t.Fatal(err)
	}
	return n
}

// effects returns the business rows, outbox events and inbox rows of id.
func (e *env) effects(t testing.TB, id string) (items, events, rows int) {
	t.Helper()
	return e.count(t, "SELECT COUNT(*) FROM "+e.items+" WHERE id = ?", id),
		e.count(t, "SELECT COUNT(*) FROM "+e.store.Table()+" WHERE aggregate_id = ?", id),
		e.count(t, "SELECT COUNT(*) FROM "+e.store.InboxTable()+" WHERE message_id = ?", id)
}

func (e *env) wantEffects(t testing.TB, id string, items, events, rows int) {
	t.Helper()
	gi, ge, gr := e.effects(t, id)
	if gi != items || ge != events || gr != rows {
		t.Errorf("%s: business rows %d, outbox events %d, inbox rows %d; want %d, %d, %d", id, gi, ge, gr, items, events, rows)
	}
}

// age moves the inbox row of id (or failure row, with failures) back by
// two hours.
func (e *env) age(t testing.TB, id string, failures bool) {
	t.Helper()
	table, col := e.store.InboxTable(), "received_at"
	if failures {
		table, col = e.store.InboxFailuresTable(), "failed_at"
	}
	expr := map[string]string{
		"mysql":    col + " - INTERVAL 2 HOUR",
		"postgres": col + " - INTERVAL '2 hours'",
		"sqlite":   col + " - 7200000000",
	}[e.name]
	if n := e.count(t, "SELECT COUNT(*) FROM "+table+" WHERE message_id = ?", id); n != 1 {
		t.Fatalf("age %s: %d rows", id, n)
	}
	if _, err := e.db.Exec(e.db.Rebind("UPDATE "+table+" SET "+col+" = "+expr+" WHERE message_id = ?"), id); err != nil {
		t.Fatal(err)
	}
}

func mustResult(t testing.TB, got inbox.Result, err error, want inbox.Result) {
	t.Helper()
	if got != want {
		t.Fatalf("result %v (error %v), want %v", got, err, want)
	}
	if want == inbox.Applied || want == inbox.Duplicate {
		if err != nil {
			t.Fatalf("result %v with error %v", got, err)
		}
	}
}

var errBoom = errors.New("boom")
