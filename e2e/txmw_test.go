package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// guard bounds a wait on a signal, so that a broken implementation fails
// the test instead of hanging it. It is not a timed assertion.
const guard = 30 * time.Second

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Fatalf("%s did not happen within %v", what, guard)
	}
}

func TestCommitPolicy(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		cases := []struct {
			name     string
			write    func(w http.ResponseWriter, r *http.Request)
			status   int
			body     string
			location string
			commit   bool
		}{
			{"implicit 200", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }, 200, "ok", "", true},
			{"empty body", func(w http.ResponseWriter, r *http.Request) {}, 200, "", "", true},
			{"201", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Location", "/items/1")
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte(`{"ok":true}`))
			}, 201, `{"ok":true}`, "/items/1", true},
			{"204", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }, 204, "", "", true},
			{"302", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/elsewhere", http.StatusFound) }, 302, "", "/elsewhere", false},
			{"400", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "bad input", http.StatusBadRequest) }, 400, "bad input\n", "", false},
			{"500", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "broken", http.StatusInternalServerError) }, 500, "broken\n", "", false},
		}
		r := f.router()
		for i, c := range cases {
			r.Post(fmt.Sprintf("/case/%d/{id}", i), func(w http.ResponseWriter, r *http.Request) {
				if err := f.create(r, chi.URLParam(r, "id")); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				c.write(w, r)
			})
		}
		e, _ := serve(t, r)
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				id := fmt.Sprintf("policy-%d", i)
				resp := e.POST("/case/{i}/{id}", i, id).WithRedirectPolicy(httpexpect.DontFollowRedirects).
					Expect().Status(c.status)
				resp.Body().IsEqual(c.body)
				if c.location != "" {
					resp.Header("Location").HasSuffix(c.location)
				}
				want := 0
				if c.commit {
					want = 1
				}
				if got := f.itemRows(t, id); got != want {
					t.Errorf("item rows = %d, want %d", got, want)
				}
				if got := f.eventRows(t, id); got != want {
					t.Errorf("outbox rows = %d, want %d", got, want)
				}
				if f.hooks.has("commit:"+id) != c.commit || f.hooks.has("rollback:"+id) == c.commit {
					t.Errorf("hooks = %s, want commit=%v", f.hooks.String(), c.commit)
				}
			})
		}
	})
}

// TestCommitFailure makes COMMIT itself fail after the handler answered
// 201: the client must get a 5xx without the handler's body, and nothing
// may be stored or announced.
func TestCommitFailure(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		r := f.router()
		var sabotage func(t *testing.T, r *http.Request) error
		switch f.name {
		case "sqlite", "postgres":
			// A deferred foreign key is checked at COMMIT only.
			parent, child := f.items+"_p", f.items+"_c"
			f.exec(t, "CREATE TABLE "+parent+" (id VARCHAR(64) PRIMARY KEY)")
			f.exec(t, "CREATE TABLE "+child+" (id VARCHAR(64) PRIMARY KEY, parent_id VARCHAR(64) REFERENCES "+parent+"(id) DEFERRABLE INITIALLY DEFERRED)")
			t.Cleanup(func() { f.exec(t, "DROP TABLE "+child); f.exec(t, "DROP TABLE "+parent) })
			sabotage = func(t *testing.T, r *http.Request) error {
				_, err := txmw.Tx(r.Context()).ExecContext(r.Context(), "INSERT INTO "+child+" (id, parent_id) VALUES ('c1', 'missing')")
				return err
			}
		case "mysql":
			// Kill the request's session from another connection.
			sabotage = func(t *testing.T, r *http.Request) error {
				var id int64
				if err := txmw.Tx(r.Context()).GetContext(r.Context(), &id, "SELECT CONNECTION_ID()"); err != nil {
					return err
				}
				_, err := f.db.ExecContext(r.Context(), fmt.Sprintf("KILL CONNECTION %d", id))
				return err
			}
		}
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			if err := f.create(r, chi.URLParam(r, "id")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if chi.URLParam(r, "id") != "doomed" {
				w.WriteHeader(http.StatusCreated)
				return
			}
			if err := sabotage(t, r); err != nil {
				http.Error(w, "sabotage: "+err.Error(), http.StatusTeapot)
				return
			}
			w.Header().Set("X-Handler", "yes")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("handler body"))
		})
		e, _ := serve(t, r)

		resp := e.POST("/items/doomed").Expect()
		resp.Status(http.StatusInternalServerError)
		resp.Body().NotContains("handler body")
		resp.Headers().NotContainsKey("X-Handler")
		if n := f.itemRows(t, "doomed"); n != 0 {
			t.Errorf("item rows = %d after a failed commit", n)
		}
		if n := f.eventRows(t, "doomed"); n != 0 {
			t.Errorf("outbox rows = %d after a failed commit", n)
		}
		if f.hooks.has("commit:doomed") {
			t.Error("an after-commit hook ran after a failed commit")
		}
		if !f.hooks.has("rollback:doomed") {
			t.Error("the after-rollback hook did not run after a failed commit")
		}
		errs := f.handlerErrors()
		if len(errs) != 1 {
			t.Fatalf("error handler saw %v, want one commit error", errs)
		}
		var me *middleware.Error
		if !errors.As(errs[0], &me) || me.Op != "commit" {
			t.Errorf("error handler got %v, want a *middleware.Error with Op commit", errs[0])
		}
		// The pool still works after the failure.
		e.POST("/items/after").Expect().Status(http.StatusCreated)
		if n := f.itemRows(t, "after"); n != 1 {
			t.Errorf("item rows = %d for the request after the failure", n)
		}
	})
}

func TestPanicAfterPartialWrite(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		var seen any
		var mu sync.Mutex
		r := chi.NewRouter()
		r.Use(chimw.Recoverer)
		r.Use(func(next http.Handler) http.Handler { // sees the panic on its way to Recoverer
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() {
					if v := recover(); v != nil {
						mu.Lock()
						seen = v
						mu.Unlock()
						panic(v)
					}
				}()
				next.ServeHTTP(w, r)
			})
		})
		r.Use(txmw.Transactional(f.db, f.options()...))
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			if err := f.create(r, chi.URLParam(r, "id")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("partial"))
			panic("boom")
		})
		e, _ := serve(t, r)

		resp := e.POST("/items/p1").Expect().Status(http.StatusInternalServerError)
		resp.Body().NotContains("partial")
		mu.Lock()
		if seen != "boom" {
			t.Errorf("outer middleware saw panic %v, want boom", seen)
		}
		mu.Unlock()
		if n := f.itemRows(t, "p1"); n != 0 {
			t.Errorf("item rows = %d after a panic", n)
		}
		if n := f.eventRows(t, "p1"); n != 0 {
			t.Errorf("outbox rows = %d after a panic", n)
		}
		if !f.hooks.has("rollback:p1") || f.hooks.has("commit:p1") {
			t.Errorf("hooks = %s, want only the rollback", f.hooks.String())
		}
	})
}

// TestClientDisconnect: the client goes away while the handler is in the
// middle of its work. The unit of work still completes as a whole.
func TestClientDisconnect(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		started, committed := make(chan struct{}), make(chan struct{})
		r := f.router()
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			id := chi.URLParam(r, "id")
			if _, err := txmw.Tx(ctx).ExecContext(ctx, f.db.Rebind("INSERT INTO "+f.items+" (id) VALUES (?)"), id+"-a"); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			close(started)
			<-middleware.ClientContext(ctx).Done() // the client is gone
			if ctx.Err() != nil {
				http.Error(w, "handler context cancelled by the disconnect", http.StatusInternalServerError)
				return
			}
			if err := f.create(r, id); err != nil { // second half of the work
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			outbox.AfterCommit(ctx, func() { close(committed) })
			w.WriteHeader(http.StatusCreated)
		})
		_, srv := serve(t, r)

		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/items/gone", nil)
		errc := make(chan error, 1)
		go func() {
			resp, err := srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		wait(t, started, "the handler start")
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("client got %v, want context.Canceled", err)
		}
		wait(t, committed, "the commit after the disconnect")
		if a, b, ev := f.itemRows(t, "gone-a"), f.itemRows(t, "gone"), f.eventRows(t, "gone"); a != 1 || b != 1 || ev != 1 {
			t.Errorf("rows (first half, second half, event) = %d, %d, %d; want all 1", a, b, ev)
		}
	})
}

func TestFlushAndHijack(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		if f.name == "sqlite" {
			// testdb gives SQLite one connection; the streaming handler
			// reads through the pool while its transaction is open.
			f.db.SetMaxOpenConns(2)
		}
		var p probe
		r := chi.NewRouter()
		r.Use(p.wrap)
		r.Use(txmw.Transactional(f.db, f.options(
			middleware.WithStreaming(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/stream/") }),
		)...))
		leaked := make(chan bool, 1)
		r.Post("/flush/{id}", func(w http.ResponseWriter, r *http.Request) {
			if err := f.create(r, chi.URLParam(r, "id")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Write([]byte("part1 "))
			w.(http.Flusher).Flush()
			if err := http.NewResponseController(w).Flush(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			leaked <- p.reached()
			w.Write([]byte("part2"))
		})
		r.Post("/hijack", func(w http.ResponseWriter, r *http.Request) {
			_, _, err := http.NewResponseController(w).Hijack()
			if !errors.Is(err, middleware.ErrHijack) {
				http.Error(w, fmt.Sprintf("Hijack returned %v", err), http.StatusInternalServerError)
				return
			}
			if _, _, err := w.(http.Hijacker).Hijack(); !errors.Is(err, middleware.ErrHijack) {
				http.Error(w, fmt.Sprintf("Hijacker returned %v", err), http.StatusInternalServerError)
				return
			}
			http.Error(w, err.Error(), http.StatusNotImplemented)
		})
		type streamSeen struct {
			reached   bool
			committed int
		}
		streamed := make(chan streamSeen, 1)
		r.Post("/stream/{id}", func(w http.ResponseWriter, r *http.Request) {
			id := chi.URLParam(r, "id")
			if err := f.create(r, id); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Write([]byte("part1 "))
			w.(http.Flusher).Flush()
			var n int
			f.db.GetContext(r.Context(), &n, f.db.Rebind("SELECT COUNT(*) FROM "+f.items+" WHERE id = ?"), id)
			streamed <- streamSeen{reached: p.reached(), committed: n}
			w.Write([]byte("part2"))
		})
		e, _ := serve(t, r)

		e.POST("/flush/f1").Expect().Status(http.StatusOK).Body().IsEqual("part1 part2")
		if <-leaked {
			t.Error("Flush under buffering let bytes reach the client before the commit")
		}
		if f.itemRows(t, "f1") != 1 {
			t.Error("the flushed request did not commit")
		}

		e.POST("/hijack").Expect().Status(http.StatusNotImplemented).Body().Contains("Hijack is not possible")

		e.POST("/stream/s1").Expect().Status(http.StatusOK).Body().IsEqual("part1 part2")
		seen := <-streamed
		if !seen.reached {
			t.Error("a streamed response did not reach the client on Flush")
		}
		if seen.committed != 0 {
			t.Error("the streamed request's row was visible before the handler returned")
		}
		if f.itemRows(t, "s1") != 1 || !f.hooks.has("commit:s1") {
			t.Error("the streamed request did not commit")
		}
	})
}

// TestNestedOneConnection: a second Transactional on a sub-router and a
// Transact inside the handler join the request's transaction; with one
// connection in the pool, nothing waits for a second.
func TestNestedOneConnection(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		f.db.SetMaxOpenConns(1)
		// A deadlock would surface as a 503 after a second, not as a hang.
		opts := f.options(middleware.WithBeginTimeout(time.Second))
		r := chi.NewRouter()
		r.Use(txmw.Transactional(f.db, opts...))
		var outer *sqlx.Tx
		r.Route("/nested", func(r chi.Router) {
			r.Use(func(next http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					outer = txmw.Tx(r.Context())
					next.ServeHTTP(w, r)
				})
			})
			r.Use(txmw.Transactional(f.db, opts...))
			r.Post("/{id}", func(w http.ResponseWriter, r *http.Request) {
				id := chi.URLParam(r, "id")
				if txmw.Tx(r.Context()) != outer {
					http.Error(w, "the inner middleware began a second transaction", http.StatusInternalServerError)
					return
				}
				if err := f.create(r, id); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				err := txmw.Transact(r.Context(), f.db, func(ctx context.Context, tx *sqlx.Tx) error {
					if tx != outer {
						return errors.New("Transact began a second transaction")
					}
					_, err := tx.ExecContext(ctx, f.db.Rebind("INSERT INTO "+f.items+" (id) VALUES (?)"), id+"-inner")
					return err
				})
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
		})
		e, _ := serve(t, r)

		e.POST("/nested/n1").Expect().Status(http.StatusCreated)
		if f.itemRows(t, "n1") != 1 || f.itemRows(t, "n1-inner") != 1 || f.eventRows(t, "n1") != 1 {
			t.Error("the nested request did not commit all its rows")
		}
		if !f.hooks.has("commit:n1") {
			t.Error("the after-commit hook did not run")
		}
	})
}

func TestPoolExhaustion(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		f.db.SetMaxOpenConns(1)
		r := f.router(middleware.WithBeginTimeout(50 * time.Millisecond))
		var ran, wentOn atomic.Bool
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			ran.Store(true)
			f.create(r, chi.URLParam(r, "id")) // the transaction begins here
			wentOn.Store(true)
			w.WriteHeader(http.StatusCreated)
		})
		e, _ := serve(t, r)

		conn, err := f.db.Conn(context.Background()) // the only connection
		if err != nil {
			t.Fatal(err)
		}
		resp := e.POST("/items/x1").Expect().Status(http.StatusServiceUnavailable)
		resp.Header("Retry-After").IsEqual("1")
		conn.Close()
		// The transaction begins at its first use: the handler runs up to
		// it, and no further.
		if !ran.Load() || wentOn.Load() {
			t.Errorf("handler ran %v, went on past its first use of the transaction %v; want true, false", ran.Load(), wentOn.Load())
		}
		if errs := f.handlerErrors(); len(errs) != 1 || !errors.Is(errs[0], middleware.ErrBeginTimeout) {
			t.Errorf("error handler saw %v, want ErrBeginTimeout", errs)
		}
		if n := f.count(t, f.store.Table(), ""); n != 0 {
			t.Errorf("%d outbox rows after a 503", n)
		}
		// With the connection back, requests work again.
		e.POST("/items/x2").Expect().Status(http.StatusCreated)
	})
}

// TestTxDeadline: the transaction's own deadline passes before COMMIT. The
// error is ErrTxTimeout, not a bare sql.ErrTxDone, and nothing is stored.
func TestTxDeadline(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		r := f.router(middleware.WithTimeout(100 * time.Millisecond))
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			if err := f.create(r, chi.URLParam(r, "id")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			<-r.Context().Done() // the deadline passes
			w.WriteHeader(http.StatusCreated)
		})
		e, _ := serve(t, r)
		e.POST("/items/late").Expect().Status(http.StatusInternalServerError)
		errs := f.handlerErrors()
		if len(errs) != 1 || !errors.Is(errs[0], middleware.ErrTxTimeout) || !errors.Is(errs[0], context.DeadlineExceeded) {
			t.Errorf("error handler saw %v, want ErrTxTimeout wrapping context.DeadlineExceeded", errs)
		}
		if f.itemRows(t, "late") != 0 || f.eventRows(t, "late") != 0 {
			t.Error("rows stored past the deadline")
		}
	})
}

// TestSafeMethodsPassThrough: GET gets no transaction by default, and
// Publish in it fails fast.
func TestSafeMethodsPassThrough(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		r := f.router()
		r.Get("/publish", func(w http.ResponseWriter, r *http.Request) {
			if _, ok := txmw.TxFrom(r.Context()); ok {
				http.Error(w, "GET got a transaction", http.StatusInternalServerError)
				return
			}
			_, err := outbox.Publish(r.Context(), outbox.Envelope{Type: itemCreated, JSON: []byte(`{}`)})
			if !errors.Is(err, outbox.ErrNoTx) {
				http.Error(w, fmt.Sprintf("Publish returned %v", err), http.StatusInternalServerError)
				return
			}
			w.Write([]byte("no tx"))
		})
		e, _ := serve(t, r)
		e.GET("/publish").Expect().Status(http.StatusOK).Body().IsEqual("no tx")
	})
}

// TestConcurrentPosts: 50 POSTs at once, with the dispatcher running; on
// SQLite none may fail with "database is locked".
func TestConcurrentPosts(t *testing.T) {
	for _, c := range []struct {
		name, db string
		conns    int // 0: testdb's pool (one connection for SQLite)
	}{{"sqlite", "sqlite", 0}, {"sqlite-8-conns", "sqlite", 8}, {"mysql", "mysql", 0}, {"postgres", "postgres", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const n = 50
			f := newFixture(t, c.db, outbox.Config{})
			if c.conns > 0 {
				// Concurrent writers meet in SQLite's busy handler
				// instead of the pool: BEGIN IMMEDIATE and busy_timeout
				// must keep "database is locked" away.
				f.db.SetMaxOpenConns(c.conns)
			}
			var seenMu sync.Mutex
			seen := map[string]bool{}
			allDelivered := make(chan struct{})
			f.ob.Handle("listener-1", func(ctx context.Context, ev outbox.Event) error {
				seenMu.Lock()
				defer seenMu.Unlock()
				if !seen[ev.ID] {
					seen[ev.ID] = true
					if len(seen) == n {
						close(allDelivered)
					}
				}
				return nil
			}, itemCreated)

			if err := f.ob.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := f.router()
			r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
				if err := f.create(r, chi.URLParam(r, "id")); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			e, _ := serve(t, r)

			var wg sync.WaitGroup
			var mu sync.Mutex
			var failures []string
			for i := range n {
				wg.Go(func() {
					resp := e.POST("/items/c{i}", i).Expect()
					if code := resp.Raw().StatusCode; code != http.StatusCreated {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("%d %s", code, resp.Body().Raw()))
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			for _, fl := range failures {
				if strings.Contains(fl, "locked") || strings.Contains(fl, "busy") {
					t.Errorf("database is locked: %s", fl)
				} else {
					t.Errorf("request failed: %s", fl)
				}
			}
			for _, err := range f.handlerErrors() {
				t.Errorf("middleware error: %v", err)
			}
			if got := f.count(t, f.items, ""); got != n {
				t.Errorf("%d item rows, want %d", got, n)
			}
			wait(t, allDelivered, "delivery of every event")
		})
	}
}

// TestHotListenerSeesRow: the listener called on the hot path, right after
// the commit, reads the business row through the pool and finds it.
func TestHotListenerSeesRow(t *testing.T) {
	eachDB(t, func(t *testing.T, f *fixture) {
		type seen struct {
			path  outbox.Path
			found int
			err   error
		}
		got := make(chan seen, 1)
		f.ob.Handle("listener-2", func(ctx context.Context, ev outbox.Event) error {
			var n int
			err := f.db.GetContext(ctx, &n, f.db.Rebind("SELECT COUNT(*) FROM "+f.items+" WHERE id = ?"), ev.AggregateID)
			select {
			case got <- seen{ev.Path, n, err}:
			default:
			}
			return nil
		}, itemCreated)

		if err := f.ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		r := f.router()
		r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			if err := f.create(r, chi.URLParam(r, "id")); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		e, _ := serve(t, r)
		e.POST("/items/hot").Expect().Status(http.StatusCreated)
		var s seen
		select {
		case s = <-got:
		case <-time.After(guard):
			t.Fatal("the listener was not called")
		}
		if s.err != nil || s.found != 1 {
			t.Errorf("listener found %d rows (err %v), want 1", s.found, s.err)
		}
		if s.path != outbox.PathHot {
			t.Errorf("event came on path %v, want the hot path", s.path)
		}
	})
}
