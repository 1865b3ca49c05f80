package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gavv/httpexpect/v2"
	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/txmw"
)

// databases are the ones the HTTP unit of work is tested on: all three.
var databases = testdb.Names

const itemCreated outbox.EventType = "item.created"

// fixture is one database with a migrated outbox table, a business table
// and an Outbox over them, all removed when the test ends.
type fixture struct {
	name  string
	db    *sqlx.DB
	items string // business table
	store *sqlstore.Store
	ob    *outbox.Outbox
	hooks hookLog

	errMu sync.Mutex
	errs  []error // what the ErrorHandler saw
}

func eachDB(t *testing.T, fn func(t *testing.T, f *fixture)) {
	t.Helper()
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, newFixture(t, name, outbox.Config{}))
		})
	}
}

func newFixture(t *testing.T, name string, cfg outbox.Config) *fixture {
	t.Helper()
	db := testdb.Open(t, name)
	store := testdb.Store(t, db)
	f := &fixture{name: name, db: db, store: store, items: testdb.TableName("items")}
	f.exec(t, "CREATE TABLE "+f.items+" (id VARCHAR(64) PRIMARY KEY, note VARCHAR(200) NOT NULL DEFAULT '')")
	t.Cleanup(func() { testdb.DropTable(t, db, f.items) })
	ob, err := outbox.New(store, cfg)
	if err != nil {
		t.Fatalf("outbox.New: %v", err)
	}
	t.Cleanup(func() {
		if err := ob.Close(context.Background()); err != nil {
			t.Errorf("close outbox: %v", err)
		}
	})
	f.ob = ob
	return f
}

func (f *fixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// count counts rows through the pool, outside any request.
func (f *fixture) count(t *testing.T, table, where string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.Get(&n, f.db.Rebind("SELECT COUNT(*) FROM "+table+" "+where), args...); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

func (f *fixture) itemRows(t *testing.T, id string) int {
	return f.count(t, f.items, "WHERE id = ?", id)
}

func (f *fixture) eventRows(t *testing.T, id string) int {
	return f.count(t, f.store.Table(), "WHERE aggregate_id = ?", id)
}

// options are the Transactional options every test uses: the fixture's
// outbox, and an ErrorHandler that records what it answers.
func (f *fixture) options(extra ...txmw.Option) []txmw.Option {
	return append([]txmw.Option{
		middleware.WithOutbox(f.ob),
		middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			f.errMu.Lock()
			f.errs = append(f.errs, err)
			f.errMu.Unlock()
			middleware.DefaultErrorHandler(w, r, err)
		}),
	}, extra...)
}

func (f *fixture) handlerErrors() []error {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return slices.Clone(f.errs)
}

// create is the business step of most handlers: it inserts item id through
// the request's transaction, publishes item.created, and records the
// transaction's outcome through hooks.
func (f *fixture) create(r *http.Request, id string) error {
	ctx := r.Context()
	if _, err := txmw.Tx(ctx).ExecContext(ctx, f.db.Rebind("INSERT INTO "+f.items+" (id) VALUES (?)"), id); err != nil {
		return err
	}
	if _, err := outbox.Publish(ctx, outbox.Envelope{
		Type: itemCreated, AggregateType: "item", AggregateID: id,
		JSON: json.RawMessage(fmt.Sprintf(`{"id":%q}`, id)),
	}); err != nil {
		return err
	}
	if err := outbox.AfterCommit(ctx, func() { f.hooks.add("commit:" + id) }); err != nil {
		return err
	}
	return outbox.AfterRollback(ctx, func() { f.hooks.add("rollback:" + id) })
}

// serve starts r on a test server and returns an httpexpect for it.
func serve(t *testing.T, r http.Handler) (*httpexpect.Expect, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return httpexpect.WithConfig(httpexpect.Config{
		BaseURL:  srv.URL,
		Client:   srv.Client(),
		Reporter: httpexpect.NewAssertReporter(t),
		Printers: []httpexpect.Printer{httpexpect.NewCompactPrinter(t)},
	}), srv
}

func (f *fixture) router(opts ...txmw.Option) *chi.Mux {
	r := chi.NewRouter()
	r.Use(txmw.Transactional(f.db, f.options(opts...)...))
	return r
}

// hookLog records hook calls in order.
type hookLog struct {
	mu    sync.Mutex
	calls []string
}

func (h *hookLog) add(s string) {
	h.mu.Lock()
	h.calls = append(h.calls, s)
	h.mu.Unlock()
}

func (h *hookLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.calls, ",")
}

func (h *hookLog) has(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.calls, s)
}

// probe sits outside the middleware and records whether anything reached
// the real response writer.
type probe struct {
	mu   sync.Mutex
	sent bool
}

func (p *probe) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&probeWriter{ResponseWriter: w, p: p}, r)
	})
}

func (p *probe) reached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sent
}

func (p *probe) mark() {
	p.mu.Lock()
	p.sent = true
	p.mu.Unlock()
}

type probeWriter struct {
	http.ResponseWriter
	p *probe
}

func (w *probeWriter) WriteHeader(code int) { w.p.mark(); w.ResponseWriter.WriteHeader(code) }
func (w *probeWriter) Write(b []byte) (int, error) {
	w.p.mark()
	return w.ResponseWriter.Write(b)
}
func (w *probeWriter) Flush() {
	w.p.mark()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}
func (w *probeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
