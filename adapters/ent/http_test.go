package entoutbox_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/gavv/httpexpect/v2"
	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
)

// TestHTTP checks the request-scoped middleware end to end: the handler
// writes its response first and its data after, so a response that gets
// out before the commit would show up as a missing row.
func TestHTTP(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		var hooksRan atomic.Int32

		r := chi.NewRouter()
		r.Use(chimw.Recoverer)
		r.Use(entoutbox.Transactional(f.client, middleware.WithOutbox(f.ob)))
		r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
			status, _ := strconv.Atoi(r.URL.Query().Get("status"))
			w.WriteHeader(status)
			w.Write([]byte("answer"))
			// After the response was written: only buffering makes this
			// part of what a 2xx promises.
			ctx := r.Context()
			tx := entoutbox.Tx[*testent.Tx](ctx)
			f.createOrder(ctx, tx, r.URL.Query().Get("customer"))
			if _, err := outbox.Publish(ctx, outbox.Envelope{Type: "placed", JSON: []byte(`{}`)}); err != nil {
				t.Errorf("Publish: %v", err)
			}
			outbox.AfterCommit(ctx, func() { hooksRan.Add(1) })
			if r.URL.Query().Get("panic") != "" {
				panic("boom")
			}
		})
		r.Post("/nested", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			f.publish(ctx, "outer")
			// A handler that binds the request's transaction again
			// changes nothing.
			if entoutbox.Bind(ctx, entoutbox.Tx[*testent.Tx](ctx)) != ctx {
				t.Error("Bind of the request's transaction made a new context")
			}
			err := entoutbox.Savepoint(ctx, func(ctx context.Context) error {
				f.createOrder(ctx, entoutbox.Tx[*testent.Tx](ctx), "inner")
				f.publish(ctx, "inner")
				return errAbort
			})
			if !errors.Is(err, errAbort) {
				t.Errorf("Savepoint: %v", err)
			}
			w.WriteHeader(http.StatusCreated)
		})
		r.Get("/orders", func(w http.ResponseWriter, r *http.Request) {
			_, err := outbox.Publish(r.Context(), outbox.Envelope{Type: "read", JSON: []byte(`{}`)})
			if _, ok := entoutbox.TxFrom[*testent.Tx](r.Context()); ok || !errors.Is(err, outbox.ErrNoTx) {
				t.Errorf("in a GET: TxFrom reported a transaction, or Publish returned %v", err)
			}
			w.WriteHeader(http.StatusBadRequest)
		})
		srv := httptest.NewServer(r)
		defer srv.Close()
		e := httpexpect.Default(t, srv.URL)

		// 2xx: committed and hooks run before the client sees the answer.
		e.POST("/orders").WithQuery("status", 201).WithQuery("customer", "ada").
			Expect().Status(http.StatusCreated).Body().IsEqual("answer")
		if got := f.customers(); !slices.Equal(got, []string{"ada"}) {
			t.Fatalf("orders %v after a 201", got)
		}
		if hooksRan.Load() != 1 {
			t.Fatal("the after-commit hook had not run when the 201 arrived")
		}

		// 4xx: rolled back; the buffered response still goes out.
		e.POST("/orders").WithQuery("status", 409).WithQuery("customer", "bob").
			Expect().Status(http.StatusConflict).Body().IsEqual("answer")

		// Panic: rolled back, nothing of the buffered 201 is sent.
		e.POST("/orders").WithQuery("status", 201).WithQuery("customer", "eve").WithQuery("panic", 1).
			Expect().Status(http.StatusInternalServerError)

		// A savepoint rolled back inside the request.
		e.POST("/nested").Expect().Status(http.StatusCreated)

		// GET has no transaction: Publish fails fast.
		e.GET("/orders").Expect().Status(http.StatusBadRequest)

		if got := f.customers(); !slices.Equal(got, []string{"ada"}) {
			t.Fatalf("orders %v, want only ada's", got)
		}
		if got := f.rows(); !slices.Equal(got, []string{"outer", "placed"}) {
			t.Fatalf("outbox rows %v", got)
		}
		if hooksRan.Load() != 1 {
			t.Fatalf("after-commit hooks ran %d times, want 1", hooksRan.Load())
		}
		f.expect("placed", "outer")
	})
}

func TestTransactionalNilClient(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Transactional(nil client) did not panic")
		}
	}()
	var c *testent.Client
	entoutbox.Transactional(c)
}
