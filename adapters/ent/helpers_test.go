package entoutbox_test

import (
	"context"
	"database/sql"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent/order"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// databases are the databases every behaviour is tested on: all that
// testdb opens, each failing rather than skipping when its server is
// missing in CI (TXOUTBOX_REQUIRE_DB).
var databases = testdb.Names

// fixture is one test's world: an ent client and a fresh outbox table
// over one *sql.DB, and a started outbox that records what its listeners
// receive.
type fixture struct {
	t      *testing.T
	client *testent.Client
	sx     *sqlx.DB
	outbox string // quoted table name
	ob     *outbox.Outbox
	ctx    context.Context // carries ob
	got    *recorder
}

// open returns a *sql.DB on a database of its own: a fresh SQLite file,
// or a fresh MariaDB or PostgreSQL database (ent's table names are fixed
// by the schema, and other tests run against the same server).
func open(t *testing.T, name string) (*sql.DB, string) {
	t.Helper()
	switch name {
	case "sqlite":
		return testdb.SQLite(t).DB, dialect.SQLite
	case "postgres":
		return privateDB(t, testdb.Postgres(t), "pgx", func(dbName string) string {
			u, err := url.Parse(testdb.PostgresDSN())
			if err != nil {
				t.Fatal(err)
			}
			u.Path = "/" + dbName
			return u.String()
		}), dialect.Postgres
	}
	return privateDB(t, testdb.MySQL(t), "mysql", func(dbName string) string {
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = dbName
		return cfg.FormatDSN()
	}), dialect.MySQL
}

// privateDB creates a database on admin's server, dropped when t ends,
// and opens it with the DSN that dsn returns for its name.
func privateDB(t *testing.T, admin *sqlx.DB, driver string, dsn func(dbName string) string) *sql.DB {
	t.Helper()
	dbName := testdb.TableName("entoutbox")
	if _, err := admin.Exec("CREATE DATABASE " + dbName); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE " + dbName); err != nil {
			t.Errorf("drop database %s: %v", dbName, err)
		}
	})
	db, err := sql.Open(driver, dsn(dbName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the DROP
	return db
}

func setup(t *testing.T, name string) *fixture {
	t.Helper()
	sqlDB, dia := open(t, name)
	sx := sqlx.NewDb(sqlDB, map[string]string{dialect.SQLite: "sqlite", dialect.MySQL: "mysql", dialect.Postgres: "pgx"}[dia])
	store := testdb.Store(t, sx)
	client := testent.NewClient(testent.Driver(entsql.OpenDB(dia, sqlDB)))
	ctx := context.Background()
	if err := client.Schema.Create(ctx); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	rec := &recorder{ch: make(chan outbox.Event, 100), n: map[outbox.EventType]int{}}
	// No poller: every delivery in these tests comes from an after-commit
	// hook, which is what they check.
	ob, err := outbox.New(store, outbox.Config{DisablePoller: true})
	if err != nil {
		t.Fatal(err)
	}
	ob.Handle("all", rec.listen)
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, client: client, sx: sx, outbox: store.Table(), ob: ob, ctx: outbox.NewContext(ctx, ob), got: rec}
	t.Cleanup(f.close) // before the tables go
	return f
}

func (f *fixture) close() {
	if err := f.ob.Close(context.Background()); err != nil {
		f.t.Errorf("outbox Close: %v", err)
	}
}

func (f *fixture) begin() *testent.Tx {
	f.t.Helper()
	tx, err := f.client.Tx(f.ctx)
	if err != nil {
		f.t.Fatalf("begin: %v", err)
	}
	// A failed test must not leave it open; after Commit this does nothing.
	f.t.Cleanup(func() { tx.Rollback() })
	return tx
}

func (f *fixture) publish(ctx context.Context, typ string) {
	f.t.Helper()
	if _, err := outbox.Publish(ctx, outbox.Envelope{Type: outbox.EventType(typ), JSON: []byte(`{}`)}); err != nil {
		f.t.Fatalf("Publish %s: %v", typ, err)
	}
}

func (f *fixture) createOrder(ctx context.Context, tx *testent.Tx, customer string) {
	f.t.Helper()
	if _, err := tx.Order.Create().SetCustomer(customer).SetTotal(1).Save(ctx); err != nil {
		f.t.Fatalf("create order: %v", err)
	}
}

// rows returns the sorted event types stored in the outbox table.
func (f *fixture) rows() []string {
	f.t.Helper()
	var types []string
	if err := f.sx.Select(&types, "SELECT event_type FROM "+f.outbox); err != nil {
		f.t.Fatalf("read outbox: %v", err)
	}
	slices.Sort(types)
	return types
}

// customers returns the sorted customers of the committed orders.
func (f *fixture) customers() []string {
	f.t.Helper()
	cs, err := f.client.Order.Query().Order(order.ByCustomer()).Select(order.FieldCustomer).Strings(context.Background())
	if err != nil {
		f.t.Fatalf("read orders: %v", err)
	}
	return cs
}

// expect waits until each of the types has been delivered, then closes
// the outbox and checks that each was delivered exactly once and nothing
// else was.
func (f *fixture) expect(types ...string) {
	f.t.Helper()
	for range types {
		select {
		case <-f.got.ch:
		case <-time.After(15 * time.Second): // a guard against hanging, not a synchronisation
			f.t.Fatalf("delivered %v; still waiting for some of %v", f.got.snapshot(), types)
		}
	}
	f.close()
	want := map[outbox.EventType]int{}
	for _, typ := range types {
		want[outbox.EventType(typ)]++
	}
	got := f.got.snapshot()
	if len(got) != len(want) {
		f.t.Fatalf("delivered %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			f.t.Fatalf("delivered %v, want %v", got, want)
		}
	}
}

type recorder struct {
	mu sync.Mutex
	n  map[outbox.EventType]int
	ch chan outbox.Event
}

func (r *recorder) listen(ctx context.Context, ev outbox.Event) error {
	r.mu.Lock()
	r.n[ev.Type]++
	r.mu.Unlock()
	select {
	case r.ch <- ev:
	default:
	}
	return nil
}

func (r *recorder) snapshot() map[outbox.EventType]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := make(map[outbox.EventType]int, len(r.n))
	for k, v := range r.n {
		m[k] = v
	}
	return m
}
