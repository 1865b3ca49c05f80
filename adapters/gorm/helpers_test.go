package gormoutbox_test

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// databases are the databases every behaviour is tested on: all that
// testdb opens, each failing rather than skipping when its server is
// missing in CI (TXOUTBOX_REQUIRE_DB).
var databases = testdb.Names

// Order is the business row the tests write next to their events.
type Order struct {
	ID       uint `gorm:"primaryKey"`
	Customer string
	Total    int
}

// fixture is one test's world: a GORM db with the plugin over the same
// *sql.DB as a fresh outbox table, a business table, and a started
// outbox that records what its listeners receive.
type fixture struct {
	t      testing.TB
	sqlDB  *sql.DB
	db     *gorm.DB
	orders string // business table
	outbox string // outbox table, quoted
	store  driver.Store
	ob     *outbox.Outbox
	ctx    context.Context // carries ob
	got    *recorder
}

func dialector(name string, sqlDB *sql.DB) gorm.Dialector {
	switch name {
	case "sqlite":
		return sqlite.Dialector{Conn: sqlDB}
	case "postgres":
		return postgres.New(postgres.Config{Conn: sqlDB})
	}
	return mysql.New(mysql.Config{Conn: sqlDB})
}

func setup(t testing.TB, name string, cfg gorm.Config) *fixture {
	t.Helper()
	sx := testdb.Open(t, name)
	store := testdb.Store(t, sx)
	cfg.Logger = logger.Discard
	pluginInConfig := cfg.Plugins != nil
	db, err := gorm.Open(dialector(name, sx.DB), &cfg)
	if err != nil {
		t.Fatalf("gorm.Open: %v", err)
	}
	if !pluginInConfig {
		if err := db.Use(&gormoutbox.Plugin{}); err != nil {
			t.Fatalf("db.Use: %v", err)
		}
	}
	orders := testdb.TableName("gorm_order")
	if err := db.Table(orders).AutoMigrate(&Order{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Migrator().DropTable(orders); err != nil {
			t.Errorf("drop %s: %v", orders, err)
		}
	})
	rec := &recorder{ch: make(chan outbox.Event, 100), n: map[outbox.EventType]int{}}
	// No poller: every delivery in these tests comes from an after-commit
	// hook, which is what they check.
	ob, err := outbox.New(store, outbox.Config{DisablePoller: true})
	if err != nil {
		t.Fatal(err)
	}
	ob.Handle("all", rec.listen)
	ctx := context.Background()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, store: store, sqlDB: sx.DB, db: db, orders: orders, outbox: store.Table(), ob: ob, ctx: outbox.NewContext(ctx, ob), got: rec}
	t.Cleanup(func() { f.close() }) // runs before the tables are dropped
	return f
}

// close stops the outbox, waiting for every delivery in flight.
func (f *fixture) close() {
	if err := f.ob.Close(context.Background()); err != nil {
		f.t.Errorf("outbox Close: %v", err)
	}
}

// gdb returns the fixture's *gorm.DB with a context that carries the
// outbox.
func (f *fixture) gdb() *gorm.DB { return f.db.WithContext(f.ctx) }

func (f *fixture) publish(tx *gorm.DB, typ string) {
	f.t.Helper()
	if _, err := gormoutbox.Publish(tx, outbox.Envelope{Type: outbox.EventType(typ), JSON: []byte(`{}`)}); err != nil {
		f.t.Fatalf("Publish %s: %v", typ, err)
	}
}

func (f *fixture) createOrder(tx *gorm.DB, customer string) {
	f.t.Helper()
	if err := tx.Table(f.orders).Create(&Order{Customer: customer, Total: 1}).Error; err != nil {
		f.t.Fatalf("create order: %v", err)
	}
}

// rows returns the sorted event types stored in the outbox table.
func (f *fixture) rows() []string {
	f.t.Helper()
	var types []string
	if err := f.db.Raw("SELECT event_type FROM " + f.outbox).Scan(&types).Error; err != nil {
		f.t.Fatalf("read outbox: %v", err)
	}
	slices.Sort(types)
	return types
}

// customers returns the sorted customers of the committed orders.
func (f *fixture) customers() []string {
	f.t.Helper()
	var cs []string
	if err := f.db.Table(f.orders).Order("customer").Pluck("customer", &cs).Error; err != nil {
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

func setupBench(b *testing.B, name string) *fixture {
	return setup(b, name, gorm.Config{SkipDefaultTransaction: true})
}
