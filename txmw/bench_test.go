package txmw_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/txmw"
)

// BenchmarkMiddleware measures what the middleware adds to a request on
// SQLite: the handler writes a small JSON body and touches no table, so the
// transactional cases cost BEGIN + COMMIT of an empty transaction plus the
// HTTP machinery.
func BenchmarkMiddleware(b *testing.B) {
	db := testdb.SQLite(b)
	body := []byte(`{"id":"01JD0000000000000000000000","status":"placed"}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		txmw.TxFrom(r.Context()) // begins the request's transaction, which begins at its first use
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	streamAll := middleware.WithStreaming(func(*http.Request) bool { return true })
	cases := []struct {
		name   string
		h      http.Handler
		method string
	}{
		{"no-middleware", handler, http.MethodPost},
		{"buffered-tx", txmw.Transactional(db)(handler), http.MethodPost},
		{"streamed-tx", txmw.Transactional(db, streamAll)(handler), http.MethodPost},
		// GET is not transactional: no transaction and no buffering.
		{"no-tx-GET", txmw.Transactional(db)(handler), http.MethodGet},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(c.method, "/orders", nil)
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				c.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}
