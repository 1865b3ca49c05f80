package middleware_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// recTx is a transaction that records what the middleware does with it.
// These tests are about HTTP behaviour; the database side is tested in
// txmw and e2e against real databases.
type recTx struct {
	txctx.Hooks
	ctx       context.Context
	opts      sql.TxOptions
	commitErr error

	mu     sync.Mutex
	events []string
}

func (t *recTx) ExecContext(context.Context, string, ...any) (sql.Result, error) {
	return nil, errors.New("recTx: no database")
}

// Commit and Rollback follow the contract of middleware.Unit: end, then run
// the hooks, through txctx.Hooks.End.
func (t *recTx) Commit() error {
	return t.Hooks.End(t.ctx, func() error { t.log("commit"); return t.commitErr }, true)
}
func (t *recTx) Rollback() error {
	return t.Hooks.End(t.ctx, func() error { t.log("rollback"); return nil }, false)
}
func (t *recTx) log(s string) {
	t.mu.Lock()
	t.events = append(t.events, s)
	t.mu.Unlock()
}
func (t *recTx) outcome() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.events, ",")
}

// begins returns a BeginFunc that hands out tx and counts calls.
func begins(tx *recTx, calls *int) middleware.BeginFunc {
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		*calls++
		tx.ctx, tx.opts = ctx, *opts
		return tx, nil
	}
}

// using begins the request's transaction, which the middleware begins at
// its first use, and then runs h: a handler that writes to the database.
func using(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok := txctx.From(r.Context()); ok {
			if _, err := txctx.Begun(t); err != nil {
				panic(err)
			}
		}
		h.ServeHTTP(w, r)
	})
}

func do(h http.Handler, method string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/x", nil))
	return rec
}

func TestBufferedResponseAndHooks(t *testing.T) {
	tx := &recTx{}
	var calls int
	var order []string
	var logs bytes.Buffer
	mw := middleware.New(begins(tx, &calls), middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	h := mw.Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otx, ok := txctx.From(r.Context())
		if begun, _ := txctx.Begun(otx); !ok || begun != tx {
			t.Error("the handler's context does not carry the transaction")
		}
		otx.AfterCommit(func() { order = append(order, "first") })
		otx.AfterCommit(func() { panic("hook failure") })
		otx.AfterCommit(func() { order = append(order, "third") })
		otx.AfterRollback(func() { order = append(order, "rollback") })
		w.Header().Set("X-App", "1")
		w.WriteHeader(http.StatusCreated)
		w.WriteHeader(http.StatusTeapot) // superfluous
		io.WriteString(w, "hello ")
		w.Write([]byte("world"))
		if tx.outcome() != "" {
			t.Error("the transaction ended before the handler returned")
		}
	})))
	rec := do(h, http.MethodPost)
	if rec.Code != http.StatusCreated || rec.Body.String() != "hello world" {
		t.Errorf("response %d %q", rec.Code, rec.Body)
	}
	if rec.Header().Get("X-App") != "1" || rec.Header().Get("Content-Length") != "11" {
		t.Errorf("headers %v", rec.Header())
	}
	if tx.outcome() != "commit" {
		t.Errorf("transaction: %s, want commit", tx.outcome())
	}
	if strings.Join(order, ",") != "first,third" {
		t.Errorf("hooks ran %v, want first,third (a panicking hook changes nothing else)", order)
	}
	if !strings.Contains(logs.String(), "after-commit hook panicked") || !strings.Contains(logs.String(), "hook failure") {
		t.Errorf("the panicking hook was not logged: %s", logs.String())
	}
	if !strings.Contains(logs.String(), "method=POST") || !strings.Contains(logs.String(), "path=/x") {
		t.Errorf("the report of the panicking hook does not name the request's method and path: %s", logs.String())
	}
}

func TestCommitFailureSendsNothingOfTheHandler(t *testing.T) {
	tx := &recTx{commitErr: errors.New("disk on fire")}
	var calls int
	var logs bytes.Buffer
	var committed, rolledBack bool
	var got error
	mw := middleware.New(begins(tx, &calls),
		middleware.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			middleware.DefaultErrorHandler(w, r, err)
		}))
	h := mw.Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx.AfterCommit(func() { committed = true })
		tx.AfterRollback(func() { rolledBack = true })
		w.Header().Set("X-App", "1")
		w.Write([]byte("secret"))
	})))
	rec := httptest.NewRecorder()
	rec.Header().Set("X-Outer", "kept")
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/x", nil))
	if rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "secret") {
		t.Errorf("response %d %q", rec.Code, rec.Body)
	}
	if rec.Header().Get("X-App") != "" || rec.Header().Get("X-Outer") != "kept" {
		t.Errorf("headers %v: want the outer ones only", rec.Header())
	}
	if committed || !rolledBack {
		t.Errorf("hooks: committed %v, rolled back %v", committed, rolledBack)
	}
	var me *middleware.Error
	if !errors.As(got, &me) || me.Op != "commit" || !strings.Contains(me.Error(), "disk on fire") {
		t.Errorf("error handler got %v", got)
	}
	if !strings.Contains(logs.String(), "commit failed") {
		t.Errorf("commit failure not logged: %s", logs.String())
	}
}

func TestPolicyAndWriterSemantics(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		code    int
		body    string
		outcome string
	}{
		{"implicit 200", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("x")) }, 200, "x", "commit"},
		{"nothing written", func(w http.ResponseWriter, r *http.Request) {}, 200, "", "commit"},
		{"1xx dropped", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusAccepted)
		}, 202, "", "commit"},
		{"204 refuses a body", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
				t.Errorf("Write after 204: %v", err)
			}
		}, 204, "", "commit"},
		{"409 rolls back", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "conflict", http.StatusConflict) }, 409, "conflict\n", "rollback"},
		{"302 rolls back", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusFound) }, 302, "", "rollback"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tx := &recTx{}
			var calls int
			rec := do(middleware.New(begins(tx, &calls)).Handler(using(c.handler)), http.MethodPost)
			if rec.Code != c.code || rec.Body.String() != c.body || tx.outcome() != c.outcome {
				t.Errorf("got %d %q %s, want %d %q %s", rec.Code, rec.Body, tx.outcome(), c.code, c.body, c.outcome)
			}
		})
	}
}

func TestCustomCommitPolicy(t *testing.T) {
	tx := &recTx{}
	var calls int
	mw := middleware.New(begins(tx, &calls), middleware.WithCommitPolicy(func(status int) bool { return status < 500 }))
	do(mw.Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
	}))), http.MethodPost)
	if tx.outcome() != "commit" {
		t.Errorf("transaction: %s, want commit under the custom policy", tx.outcome())
	}
}

func TestPanicRollsBackAndRepanics(t *testing.T) {
	tx := &recTx{}
	var calls int
	var rolledBack bool
	h := middleware.New(begins(tx, &calls)).Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx.AfterRollback(func() { rolledBack = true })
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte("partial"))
		panic("boom")
	})))
	rec := httptest.NewRecorder()
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/x", nil))
	}()
	if tx.outcome() != "rollback" || !rolledBack {
		t.Errorf("transaction: %s, rollback hook %v", tx.outcome(), rolledBack)
	}
	if rec.Body.Len() != 0 || rec.Code != http.StatusOK /* untouched */ || rec.Flushed {
		t.Errorf("something of the buffered response was sent: %d %q", rec.Code, rec.Body)
	}
}

func TestMethodsAndJoin(t *testing.T) {
	tx := &recTx{}
	var calls int
	mw := middleware.New(begins(tx, &calls))
	inner := middleware.New(begins(&recTx{}, &calls))
	var sawTx bool
	h := mw.Handler(inner.Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, sawTx = txctx.From(r.Context())
	}))))
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodOptions} {
		do(h, m)
		if calls != 0 || sawTx {
			t.Errorf("%s got a transaction", m)
		}
	}
	do(h, http.MethodDelete)
	if calls != 1 || !sawTx || tx.outcome() != "commit" {
		t.Errorf("nested DELETE: %d begins, tx seen %v, %s; want one begin, joined, committed", calls, sawTx, tx.outcome())
	}

	calls = 0
	get := middleware.New(begins(&recTx{}, &calls), middleware.WithMethods(http.MethodGet))
	do(get.Handler(using(http.NotFoundHandler())), http.MethodGet)
	do(get.Handler(using(http.NotFoundHandler())), http.MethodPost)
	if calls != 1 {
		t.Errorf("WithMethods(GET): %d begins for a GET and a POST, want 1", calls)
	}
}

func TestTxOptionsAndContext(t *testing.T) {
	tx := &recTx{}
	var calls int
	mw := middleware.New(begins(tx, &calls), middleware.WithIsolation(sql.LevelSerializable), middleware.WithReadOnly(true))
	client, cancel := context.WithCancel(context.Background())
	var handlerCtx context.Context
	h := mw.Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlerCtx = r.Context()
		cancel() // the client goes away
		if r.Context().Err() != nil || tx.ctx.Err() != nil {
			t.Error("the client's cancellation reached the transaction")
		}
		if middleware.ClientContext(r.Context()).Err() == nil {
			t.Error("ClientContext does not report the client's cancellation")
		}
		w.WriteHeader(http.StatusNoContent)
	})))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/x", nil).WithContext(client))
	if tx.opts != (sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true}) {
		t.Errorf("BeginFunc got options %+v", tx.opts)
	}
	if _, ok := handlerCtx.Deadline(); !ok {
		t.Error("the handler's context has no deadline")
	}
	if tx.outcome() != "commit" {
		t.Errorf("transaction: %s after a disconnect, want commit", tx.outcome())
	}
}

func TestBeginFailure(t *testing.T) {
	var ran bool
	mw := middleware.New(func(context.Context, *sql.TxOptions) (middleware.Unit, error) {
		return nil, errors.New("connection refused")
	}, middleware.WithLogger(slog.New(slog.DiscardHandler)))
	rec := do(mw.Handler(using(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true }))), http.MethodPost)
	if ran || rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("handler ran %v, response %d %v", ran, rec.Code, rec.Header())
	}
}

// TestBeginTimeout: begin blocks until its context ends, as database/sql
// does when the pool is exhausted.
func TestBeginTimeout(t *testing.T) {
	var got error
	mw := middleware.New(func(ctx context.Context, _ *sql.TxOptions) (middleware.Unit, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, middleware.WithBeginTimeout(1), middleware.WithLogger(slog.New(slog.DiscardHandler)),
		middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			middleware.DefaultErrorHandler(w, r, err)
		}))
	rec := do(mw.Handler(using(http.NotFoundHandler())), http.MethodPost)
	if rec.Code != http.StatusServiceUnavailable || !errors.Is(got, middleware.ErrBeginTimeout) {
		t.Errorf("response %d, error %v", rec.Code, got)
	}
}

func TestFlushHijackBuffered(t *testing.T) {
	tx := &recTx{}
	var calls int
	rec := httptest.NewRecorder()
	h := middleware.New(begins(tx, &calls)).Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("a"))
		w.(http.Flusher).Flush()
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		if rec.Flushed || rec.Body.Len() > 0 {
			t.Error("Flush let bytes out before the commit")
		}
		if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, middleware.ErrHijack) {
			t.Errorf("Hijack: %v", err)
		}
	})))
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/x", nil))
	if rec.Body.String() != "a" {
		t.Errorf("body %q", rec.Body)
	}
}

func TestStreaming(t *testing.T) {
	stream := middleware.WithStreaming(func(r *http.Request) bool { return true })
	t.Run("flush passes", func(t *testing.T) {
		tx := &recTx{}
		var calls int
		rec := httptest.NewRecorder()
		h := middleware.New(begins(tx, &calls), stream).Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("a"))
			w.(http.Flusher).Flush()
			if !rec.Flushed || rec.Body.String() != "a" {
				t.Error("a streamed Flush did not reach the client")
			}
		})))
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/x", nil))
		if tx.outcome() != "commit" {
			t.Errorf("transaction: %s", tx.outcome())
		}
	})
	t.Run("commit failure after the status aborts", func(t *testing.T) {
		tx := &recTx{commitErr: errors.New("gone")}
		var calls int
		h := middleware.New(begins(tx, &calls), stream, middleware.WithLogger(slog.New(slog.DiscardHandler))).
			Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("a")) })))
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		do(h, http.MethodPost)
	})
	t.Run("commit failure before any byte answers", func(t *testing.T) {
		tx := &recTx{commitErr: errors.New("gone")}
		var calls int
		h := middleware.New(begins(tx, &calls), stream, middleware.WithLogger(slog.New(slog.DiscardHandler))).
			Handler(using(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
		if rec := do(h, http.MethodPost); rec.Code != http.StatusInternalServerError {
			t.Errorf("response %d, want 500", rec.Code)
		}
	})
}

func TestConstructionPanics(t *testing.T) {
	begin := func(context.Context, *sql.TxOptions) (middleware.Unit, error) { return nil, nil }
	for name, f := range map[string]func(){
		"nil begin":        func() { middleware.New(nil) },
		"nil option":       func() { middleware.New(begin, nil) },
		"no methods":       func() { middleware.WithMethods() },
		"lower-case":       func() { middleware.WithMethods("post") },
		"zero timeout":     func() { middleware.WithTimeout(0) },
		"negative begin":   func() { middleware.WithBeginTimeout(-1) },
		"nil policy":       func() { middleware.WithCommitPolicy(nil) },
		"nil stream":       func() { middleware.WithStreaming(nil) },
		"nil errorhandler": func() { middleware.WithErrorHandler(nil) },
		"nil logger":       func() { middleware.WithLogger(nil) },
		"nil outbox":       func() { middleware.WithOutbox(nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if v := recover(); v == nil {
					t.Error("no panic")
				} else if s, _ := v.(string); !strings.HasPrefix(s, "middleware: ") {
					t.Errorf("panic %v: want a message prefixed with the package name", v)
				}
			}()
			f()
		})
	}
}

// TestBeginReturnsNothing: a BeginFunc that returns neither a transaction
// nor an error is a binding bug; the request gets a 503, not a nil
// dereference.
func TestBeginReturnsNothing(t *testing.T) {
	mw := middleware.New(func(context.Context, *sql.TxOptions) (middleware.Unit, error) { return nil, nil },
		middleware.WithLogger(slog.New(slog.DiscardHandler)))
	if rec := do(mw.Handler(using(http.NotFoundHandler())), http.MethodPost); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("response %d", rec.Code)
	}
}

// TestLazyBegin: the transaction begins at its first use. A request that
// never uses it opens none, and its hooks still run by its status; hooks
// registered before the begin run with the transaction's; after the
// request nothing begins again.
func TestLazyBegin(t *testing.T) {
	t.Run("unused", func(t *testing.T) {
		for status, want := range map[int]string{http.StatusCreated: "commit", http.StatusConflict: "rollback"} {
			var calls int
			var ran []string
			var late txctx.Tx
			mw := middleware.New(begins(&recTx{}, &calls))
			rec := do(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				outbox.AfterCommit(r.Context(), func() { ran = append(ran, "commit") })
				outbox.AfterRollback(r.Context(), func() { ran = append(ran, "rollback") })
				late, _ = txctx.From(r.Context())
				w.WriteHeader(status)
			})), http.MethodPost)
			if calls != 0 || rec.Code != status || strings.Join(ran, ",") != want {
				t.Errorf("status %d: %d begins, response %d, hooks %v; want no begin and the %s hook", status, calls, rec.Code, ran, want)
			}
			if _, err := txctx.Begun(late); !errors.Is(err, sql.ErrTxDone) || calls != 0 {
				t.Errorf("a use after the request: %v, %d begins; want sql.ErrTxDone and none", err, calls)
			}
		}
	})
	t.Run("hooks before the begin", func(t *testing.T) {
		tx := &recTx{}
		var calls int
		var ran []string
		mw := middleware.New(begins(tx, &calls))
		do(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			outbox.AfterCommit(r.Context(), func() { ran = append(ran, "before") })
			otx, _ := txctx.From(r.Context())
			if _, err := txctx.Begun(otx); err != nil {
				t.Error(err)
			}
			otx.AfterCommit(func() { ran = append(ran, "after") })
			w.WriteHeader(http.StatusCreated)
		})), http.MethodPost)
		if calls != 1 || tx.outcome() != "commit" || strings.Join(ran, ",") != "before,after" {
			t.Errorf("%d begins, %s, hooks %v; want one begin, commit, before,after", calls, tx.outcome(), ran)
		}
	})
	t.Run("a begin failure the handler ignored", func(t *testing.T) {
		var rolledBack bool
		mw := middleware.New(func(context.Context, *sql.TxOptions) (middleware.Unit, error) {
			return nil, errors.New("connection refused")
		}, middleware.WithLogger(slog.New(slog.DiscardHandler)))
		rec := do(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			outbox.AfterRollback(r.Context(), func() { rolledBack = true })
			otx, _ := txctx.From(r.Context())
			if _, err := otx.ExecContext(r.Context(), "INSERT ..."); err == nil {
				t.Error("ExecContext without a transaction succeeded")
			}
			w.WriteHeader(http.StatusCreated) // wrongly: its write failed
		})), http.MethodPost)
		if rec.Code != http.StatusServiceUnavailable || !rolledBack {
			t.Errorf("response %d, after-rollback hook ran %v; want 503 and the hook", rec.Code, rolledBack)
		}
	})
	t.Run("a begin failure in a streamed request", func(t *testing.T) {
		mw := middleware.New(func(context.Context, *sql.TxOptions) (middleware.Unit, error) {
			return nil, errors.New("connection refused")
		}, middleware.WithLogger(slog.New(slog.DiscardHandler)), middleware.WithStreaming(func(*http.Request) bool { return true }))
		if rec := do(mw.Handler(using(http.NotFoundHandler())), http.MethodPost); rec.Code != http.StatusServiceUnavailable {
			t.Errorf("nothing sent yet: response %d, want 503", rec.Code)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			otx, _ := txctx.From(r.Context())
			otx.ExecContext(r.Context(), "INSERT ...") // fails; the handler ignores it
		}))
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("a 2xx streamed before a failed begin: recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		do(h, http.MethodPost)
	})
	t.Run("another panic after a begin failure goes on", func(t *testing.T) {
		mw := middleware.New(func(context.Context, *sql.TxOptions) (middleware.Unit, error) {
			return nil, errors.New("connection refused")
		}, middleware.WithLogger(slog.New(slog.DiscardHandler)))
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			otx, _ := txctx.From(r.Context())
			otx.ExecContext(r.Context(), "INSERT ...")
			panic("boom")
		}))
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want boom", v)
			}
		}()
		do(h, http.MethodPost)
	})
}
