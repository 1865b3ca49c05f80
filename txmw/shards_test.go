package txmw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/prom"
	"github.com/txoutbox/txoutbox/txmw"
)

// shard is one tenant shard of TestOneOutboxPerShard: its database, its
// own outbox on it, and the middleware that runs its tenants' requests.
type shard struct {
	name   string
	db     *sqlx.DB
	store  *sqlstore.Store
	ob     *outbox.Outbox
	orders string
	h      http.Handler

	mu        sync.Mutex
	delivered map[string]int // event id → deliveries
	got       chan string    // each delivery's event id
}

// order is the payload of the tests' events.
type order struct {
	Tenant int  `json:"tenant"`
	Hold   bool `json:"hold"`
}

// A team that shards its data by tenant runs one Outbox per shard in one
// process, each on its shard's database, and picks the shard's middleware
// per request. Here three shards (a private MariaDB database and
// PostgreSQL, each reached through a TCP proxy; SQLite) take requests side
// by side. One server shard's database then goes away (its proxy cuts
// every connection) while two of its events are in the hands of their
// handler: the other shards keep taking requests and delivering, the cut
// shard's requests get a 5xx and its readiness fails; when the database
// comes back,
// its events are delivered and its table owes nothing. Each shard's
// metrics carry its label on one registry, and every event reaches only
// its own shard's subscription.
func TestOneOutboxPerShard(t *testing.T) {
	for c, name := range []string{"mariadb", "postgres"} {
		t.Run("cut-"+name, func(t *testing.T) { testShards(t, c) })
	}
}

// testShards is TestOneOutboxPerShard with the database of shard c
// (0 MariaDB, 1 PostgreSQL) cut.
func testShards(t *testing.T, c int) {
	ctx := context.Background()
	mariaProxy, mariaDB := privateMariaDBViaProxy(t)
	pgProxy, pgDB := postgresViaProxy(t)
	proxy := []*testbroker.Proxy{mariaProxy, pgProxy}[c]
	reg := prometheus.NewRegistry()
	gate := make(chan struct{}) // closed: held events go through
	entered := make(chan string, 10)
	shards := []*shard{
		newShard(t, "mariadb", mariaDB, reg, gate, entered),
		newShard(t, "postgres", pgDB, reg, gate, entered),
		newShard(t, "sqlite", testdb.SQLite(t), reg, gate, entered),
	}
	others := []int{1 - c, 2} // the shards that stay up
	// Per shard, not global: a second outbox's metrics without the label
	// collide on the registry, and New says so.
	if _, err := prom.New(reg); err == nil {
		t.Fatal("prom.New on a registry that has labelled outbox metrics, without labels: no error")
	}
	// The tenant picks the shard, and the shard's middleware its database
	// and outbox.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, err := strconv.Atoi(r.URL.Query().Get("tenant"))
		if err != nil {
			http.Error(w, "tenant?", http.StatusBadRequest)
			return
		}
		shards[tenant%len(shards)].h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	post := func(tenant int, hold bool) (int, string) {
		t.Helper()
		url := fmt.Sprintf("%s/orders?tenant=%d&hold=%t", srv.URL, tenant, hold)
		res, err := http.Post(url, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, strings.TrimSpace(string(b))
	}
	mustPost := func(tenant int, hold bool) string {
		t.Helper()
		code, body := post(tenant, hold)
		if code != http.StatusCreated {
			t.Fatalf("POST for tenant %d: %d %s", tenant, code, body)
		}
		return body
	}
	published := make([][]string, len(shards)) // event ids by shard
	postAll := func(tenants ...int) {
		t.Helper()
		for _, tn := range tenants {
			i := tn % len(shards)
			published[i] = append(published[i], mustPost(tn, false))
		}
	}

	// All three deliver.
	postAll(0, 1, 2, 3, 4, 5, 6, 7, 8)
	for _, s := range shards {
		s.await(t, published[slicesIndex(shards, s)]...)
	}

	// Two events of shard c are in their handler when its database goes
	// away.
	held := []string{mustPost(c, true), mustPost(c+3, true)}
	published[c] = append(published[c], held...)
	for range held {
		select {
		case <-entered:
		case <-time.After(15 * time.Second): // a guard against hanging, not a synchronisation
			t.Fatal("the held events did not reach their handler")
		}
	}
	proxy.Cut()

	// The others go on: requests, deliveries, readiness.
	before := [2]int{len(published[others[0]]), len(published[others[1]])}
	postAll(others[0], others[1], others[0]+3, others[1]+3)
	for k, i := range others {
		shards[i].await(t, published[i][before[k]:]...)
	}
	if code, body := post(c+6, false); code < 500 {
		t.Fatalf("POST to the shard whose database is down: %d %s, want a 5xx", code, body)
	}
	for i, s := range shards {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h := s.ob.Health(hctx)
		cancel()
		if want := i != c; h.Ready != want {
			t.Fatalf("shard %s: ready %v with the %s shard's database down, want %v: %+v", s.name, h.Ready, shards[c].name, want, h.Checks)
		}
	}

	// The handler finishes while the database is away; then it comes back.
	close(gate)
	proxy.Restore()
	after := mustPost(c+9, false)
	published[c] = append(published[c], after)
	shards[c].await(t, published[c]...)
	shards[c].settled(t, len(published[c]))
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if h := shards[c].ob.Health(hctx); !h.Ready {
		t.Fatalf("the %s shard is not ready after its database came back: %+v", shards[c].name, h.Checks)
	}
	cancel()

	// Each shard delivered its own events, exactly once where nothing
	// failed, and wrote its orders to its own database.
	for i, s := range shards {
		s.mu.Lock()
		if len(s.delivered) != len(published[i]) {
			t.Errorf("shard %s delivered %d distinct events, published %d", s.name, len(s.delivered), len(published[i]))
		}
		for _, id := range published[i] {
			if n := s.delivered[id]; n == 0 || (n > 1 && !contains(held, id)) {
				t.Errorf("shard %s: event %s delivered %d times", s.name, id, n)
			}
		}
		s.mu.Unlock()
		var tenants []int
		if err := s.db.Select(&tenants, "SELECT tenant FROM "+s.orders); err != nil {
			t.Fatal(err)
		}
		if len(tenants) != len(published[i]) {
			t.Errorf("shard %s holds %d orders, want %d", s.name, len(tenants), len(published[i]))
		}
		for _, tn := range tenants {
			if tn%len(shards) != i {
				t.Errorf("shard %s holds an order of tenant %d", s.name, tn)
			}
		}
	}

	// Metrics tell the shards apart by their label.
	done := doneByShard(t, reg)
	for i, s := range shards {
		if done[s.name] < float64(len(published[i])) {
			t.Errorf("txoutbox_dispatch_total{outcome=\"done\",shard=%q} = %v, want at least %d", s.name, done[s.name], len(published[i]))
		}
	}
	if len(done) != len(shards) {
		t.Errorf("dispatch_total by shard label: %v", done)
	}
	if outbox.Default() != nil {
		t.Error("a shard's outbox became the process default")
	}
}

// privateMariaDBViaProxy creates a MariaDB database of the test's own
// (dropped at the end) and opens it through a TCP proxy, so that the test
// can take the database away from this pool alone.
func privateMariaDBViaProxy(t *testing.T) (*testbroker.Proxy, *sqlx.DB) {
	t.Helper()
	admin := testdb.MySQL(t)
	name := testdb.TableName("test_shard")
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE " + name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testbroker.NewProxy(t, cfg.Addr)
	cfg.Addr, cfg.DBName, cfg.Timeout = proxy.Addr(), name, 2*time.Second
	db, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the proxy stops and the database goes
	return proxy, db
}

// postgresViaProxy opens the PostgreSQL test database through a TCP proxy.
func postgresViaProxy(t *testing.T) (*testbroker.Proxy, *sqlx.DB) {
	t.Helper()
	testdb.Postgres(t) // skip, or fail in CI, without the server
	u, err := url.Parse(testdb.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	proxy := testbroker.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db, err := sqlx.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the proxy stops
	return proxy, db
}

func newShard(t *testing.T, name string, db *sqlx.DB, reg prometheus.Registerer, gate <-chan struct{}, entered chan<- string) *shard {
	t.Helper()
	s := &shard{name: name, db: db, orders: testdb.TableName("orders"), delivered: map[string]int{}, got: make(chan string, 100)}
	s.store = testdb.Store(t, db)
	if _, err := db.Exec("CREATE TABLE " + s.orders + " (id VARCHAR(64) PRIMARY KEY, tenant INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, db, s.orders) })
	m, err := prom.New(reg, prom.WithConstLabels(prometheus.Labels{"shard": name}))
	if err != nil {
		t.Fatalf("shard %s: prom.New: %v", name, err)
	}
	s.ob, err = outbox.New(s.store, outbox.Config{
		Metrics: m, PollInterval: 100 * time.Millisecond, PollMaxInterval: 500 * time.Millisecond,
		Lease: 3 * time.Second, StatsInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	shardIndex := map[string]int{"mariadb": 0, "postgres": 1, "sqlite": 2}[name]
	s.ob.Handle("orders", func(ctx context.Context, ev outbox.Event) error {
		var o order
		if err := json.Unmarshal(ev.Payload(), &o); err != nil {
			return outbox.Permanent(err)
		}
		if o.Tenant%3 != shardIndex {
			t.Errorf("shard %s delivered an event of tenant %d", name, o.Tenant)
		}
		if o.Hold {
			select {
			case <-gate:
			default:
				entered <- ev.ID
				<-gate
			}
		}
		s.mu.Lock()
		s.delivered[ev.ID]++
		s.mu.Unlock()
		select {
		case s.got <- ev.ID:
		default: // await has wake-ups queued already
		}
		return nil
	})
	if err := s.ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.ob.Close(context.Background()); err != nil {
			t.Errorf("shard %s: Close: %v", name, err)
		}
	})
	s.h = txmw.Transactional(db, middleware.WithOutbox(s.ob))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tenant, _ := strconv.Atoi(r.URL.Query().Get("tenant"))
		body, _ := json.Marshal(order{Tenant: tenant, Hold: r.URL.Query().Get("hold") == "true"})
		id := outbox.NewID()
		tx := txmw.Tx(ctx)
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+s.orders+" (id, tenant) VALUES (?, ?)"), id, tenant); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := outbox.Publish(ctx, outbox.Envelope{ID: id, Type: "order.placed", JSON: body}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, id)
	}))
	return s
}

// await waits until each of ids has been delivered on s.
func (s *shard) await(t *testing.T, ids ...string) {
	t.Helper()
	deadline := time.After(30 * time.Second) // a guard against hanging, not a synchronisation
	for {
		s.mu.Lock()
		missing := 0
		for _, id := range ids {
			if s.delivered[id] == 0 {
				missing++
			}
		}
		s.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-s.got:
		case <-deadline:
			t.Fatalf("shard %s: %d of %d events not delivered", s.name, missing, len(ids))
		}
	}
}

// settled waits until s's table owes nothing and holds n delivered
// events: a DONE write lost with the connection is made again, or the
// event delivered again, once the database is back. No signal says
// when, so it asks the table.
func (s *shard) settled(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := s.store.Stats(context.Background())
		if err == nil && st.Pending() == 0 && st.Done == int64(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard %s: the table still owes events 30 s after the database came back: %+v, %v", s.name, st, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the table; there is no signal
	}
}

// doneByShard sums txoutbox_dispatch_total{outcome="done"} by shard label.
func doneByShard(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "txoutbox_dispatch_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var shard, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "shard":
					shard = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if outcome == "done" {
				out[shard] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func slicesIndex(shards []*shard, s *shard) int {
	for i, x := range shards {
		if x == s {
			return i
		}
	}
	return -1
}

func contains(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
