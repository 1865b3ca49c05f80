package middleware_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

type nopTx struct{ txctx.Hooks }

func (*nopTx) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, nil }
func (*nopTx) Commit() error                                                   { return nil }
func (*nopTx) Rollback() error                                                 { return nil }

// BenchmarkHandler measures the HTTP side alone (contexts, buffering,
// hooks) with a transaction that costs nothing; txmw's BenchmarkMiddleware
// adds a real database.
func BenchmarkHandler(b *testing.B) {
	begin := func(context.Context, *sql.TxOptions) (middleware.Unit, error) { return new(nopTx), nil }
	body := []byte(`{"id":"01JD0000000000000000000000","status":"placed"}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok := txctx.From(r.Context()); ok {
			txctx.Begun(t) // the transaction begins at its first use
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"none", handler},
		{"buffered", middleware.New(begin).Handler(handler)},
		{"streamed", middleware.New(begin, middleware.WithStreaming(func(*http.Request) bool { return true })).Handler(handler)},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodPost, "/orders", nil)
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
