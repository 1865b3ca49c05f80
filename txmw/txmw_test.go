package txmw_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

type env struct {
	db    *sqlx.DB
	items string
	ob    *outbox.Outbox
	table string // outbox table
}

func setup(t testing.TB, name string) *env {
	t.Helper()
	db := testdb.Open(t, name)
	store := testdb.Store(t, db)
	e := &env{db: db, items: testdb.TableName("items"), table: store.Table()}
	if _, err := db.Exec("CREATE TABLE " + e.items + " (id VARCHAR(64) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, db, e.items) })
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })
	e.ob = ob
	return e
}

func (e *env) count(t testing.TB, table, id string) int {
	t.Helper()
	col := "id"
	if table == e.table {
		col = "aggregate_id"
	}
	var n int
	if err := e.db.Get(&n, e.db.Rebind("SELECT COUNT(*) FROM "+table+" WHERE "+col+" = ?"), id); err != nil {
		t.Fatal(err)
	}
	return n
}

func eachDB(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, setup(t, name))
		})
	}
}

type calls struct {
	mu sync.Mutex
	s  []string
}

func (c *calls) add(s string) func() {
	return func() { c.mu.Lock(); c.s = append(c.s, s); c.mu.Unlock() }
}

func (c *calls) String() string { c.mu.Lock(); defer c.mu.Unlock(); return strings.Join(c.s, ",") }

func (e *env) write(ctx context.Context, tx *sqlx.Tx, id string) error {
	if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), id); err != nil {
		return err
	}
	_, err := outbox.Publish(outbox.NewContext(ctx, e.ob), outbox.Envelope{Type: "item.created", AggregateID: id, JSON: []byte(`{}`)})
	return err
}

func TestTransact(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		var c calls
		err := txmw.Transact(ctx, e.db, func(ctx context.Context, tx *sqlx.Tx) error {
			if txmw.Tx(ctx) != tx {
				t.Error("Tx(ctx) is not the transaction passed to fn")
			}
			outbox.AfterCommit(ctx, c.add("commit1"))
			outbox.AfterRollback(ctx, c.add("rollback1"))
			outbox.AfterCommit(ctx, c.add("commit2"))
			// A nested Transact joins.
			return txmw.Transact(ctx, e.db, func(ctx context.Context, inner *sqlx.Tx) error {
				if inner != tx {
					t.Error("nested Transact began a second transaction")
				}
				return e.write(ctx, inner, "ok")
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if c.String() != "commit1,commit2" || e.count(t, e.items, "ok") != 1 || e.count(t, e.table, "ok") != 1 {
			t.Errorf("after commit: hooks %s, rows %d/%d", c.String(), e.count(t, e.items, "ok"), e.count(t, e.table, "ok"))
		}

		c = calls{}
		boom := errors.New("boom")
		err = txmw.Transact(ctx, e.db, func(ctx context.Context, tx *sqlx.Tx) error {
			outbox.AfterCommit(ctx, c.add("commit"))
			outbox.AfterRollback(ctx, c.add("rollback"))
			if err := e.write(ctx, tx, "failed"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || c.String() != "rollback" || e.count(t, e.items, "failed") != 0 || e.count(t, e.table, "failed") != 0 {
			t.Errorf("after an error: err %v, hooks %s", err, c.String())
		}

		c = calls{}
		func() {
			defer func() { recover() }()
			txmw.Transact(ctx, e.db, func(ctx context.Context, tx *sqlx.Tx) error {
				outbox.AfterRollback(ctx, c.add("rollback"))
				e.write(ctx, tx, "panicked")
				panic("boom")
			})
		}()
		if c.String() != "rollback" || e.count(t, e.items, "panicked") != 0 {
			t.Errorf("after a panic: hooks %s", c.String())
		}
	})
}

func TestAccessorsOutsideATransaction(t *testing.T) {
	ctx := context.Background()
	if _, ok := txmw.TxFrom(ctx); ok {
		t.Error("TxFrom found a transaction in an empty context")
	}
	if err := outbox.AfterCommit(ctx, func() {}); !errors.Is(err, outbox.ErrNoTx) {
		t.Errorf("AfterCommit: %v", err)
	}
	if err := outbox.AfterRollback(ctx, func() {}); !errors.Is(err, outbox.ErrNoTx) {
		t.Errorf("AfterRollback: %v", err)
	}
	defer func() {
		if v, _ := recover().(string); !strings.Contains(v, "txmw.Transactional") {
			t.Errorf("Tx panicked with %q, want advice naming txmw.Transactional", v)
		}
	}()
	txmw.Tx(ctx)
}

func TestTransactional(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		var c calls
		h := txmw.Transactional(e.db, middleware.WithOutbox(e.ob))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id := r.URL.Query().Get("id")
			if err := e.write(r.Context(), txmw.Tx(r.Context()), id); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			outbox.AfterCommit(r.Context(), c.add("commit:"+id))
			outbox.AfterRollback(r.Context(), c.add("rollback:"+id))
			if id == "bad" {
				w.WriteHeader(http.StatusUnprocessableEntity)
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		for _, id := range []string{"good", "bad"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/?id="+id, nil))
		}
		if got := strings.Split(c.String(), ","); !slices.Equal(got, []string{"commit:good", "rollback:bad"}) {
			t.Errorf("hooks %v", got)
		}
		if e.count(t, e.items, "good") != 1 || e.count(t, e.table, "good") != 1 || e.count(t, e.items, "bad") != 0 || e.count(t, e.table, "bad") != 0 {
			t.Error("rows do not match the outcomes")
		}
	})
}

func TestConstructionPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Transactional": func() { txmw.Transactional(nil) },
		"Begin":         func() { txmw.Begin(nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v, _ := recover().(string); !strings.HasPrefix(v, "txmw: ") {
					t.Errorf("panic %q", v)
				}
			}()
			f()
		})
	}
}

// TestDefaultOutbox: without WithOutbox, outbox.Publish(r.Context(), env)
// uses the package default.
func TestDefaultOutbox(t *testing.T) {
	e := setup(t, "sqlite")
	outbox.SetDefault(e.ob)
	t.Cleanup(func() { outbox.SetDefault(nil) })
	h := txmw.Transactional(e.db)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := outbox.Publish(r.Context(), outbox.Envelope{Type: "item.created", AggregateID: "dflt", JSON: []byte(`{}`)}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusAccepted || e.count(t, e.table, "dflt") != 1 {
		t.Errorf("response %d %q; the event was not stored through the default outbox", rec.Code, rec.Body)
	}
}

// Publish in a GET handler wrapped by Transactional says why there is no
// transaction (GET gets none by default) and names WithMethods; the error
// still matches outbox.ErrNoTx.
func TestPublishInAGETHandlerSaysWhy(t *testing.T) {
	e := setup(t, "sqlite")
	var got error
	h := txmw.Transactional(e.db, middleware.WithOutbox(e.ob))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, got = outbox.Publish(r.Context(), outbox.Envelope{Type: "item.viewed", JSON: []byte(`{}`)})
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	if !errors.Is(got, outbox.ErrNoTx) {
		t.Fatalf("Publish in a GET handler = %v; want an error matching ErrNoTx", got)
	}
	for _, want := range []string{"GET request", "WithMethods", "DELETE, PATCH, POST, PUT"} {
		if !strings.Contains(got.Error(), want) {
			t.Errorf("error %q does not mention %q", got, want)
		}
	}
	// Outside any middleware: the generic advice.
	if _, err := outbox.Publish(outbox.NewContext(context.Background(), e.ob), outbox.Envelope{Type: "x", JSON: []byte(`{}`)}); err != outbox.ErrNoTx {
		t.Fatalf("Publish without middleware = %v; want ErrNoTx itself", err)
	}
}
