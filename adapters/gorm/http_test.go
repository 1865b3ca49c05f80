package gormoutbox_test

import (
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
	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
)

// TestHTTP checks the request-scoped middleware end to end: the handler
// writes its response first and its data after, so a response that gets
// out before the commit would show up as a missing row.
func TestHTTP(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name, gorm.Config{})
			var hooksRan atomic.Int32

			r := chi.NewRouter()
			r.Use(chimw.Recoverer)
			r.Use(gormoutbox.Transactional(f.db, middleware.WithOutbox(f.ob)))
			place := func(w http.ResponseWriter, r *http.Request) {
				status, _ := strconv.Atoi(r.URL.Query().Get("status"))
				w.WriteHeader(status)
				w.Write([]byte("answer"))
				// After the response was written: only buffering makes this
				// part of what a 2xx promises.
				db := gormoutbox.DB(r.Context())
				f.createOrder(db, r.URL.Query().Get("customer"))
				if _, err := outbox.Publish(r.Context(), outbox.Envelope{Type: "placed", JSON: []byte(`{}`)}); err != nil {
					t.Errorf("Publish: %v", err)
				}
				gormoutbox.AfterCommit(db, func() { hooksRan.Add(1) })
				if r.URL.Query().Get("panic") != "" {
					panic("boom")
				}
			}
			r.Post("/orders", place)
			r.Get("/orders", func(w http.ResponseWriter, r *http.Request) {
				_, err := outbox.Publish(r.Context(), outbox.Envelope{Type: "read", JSON: []byte(`{}`)})
				if _, ok := gormoutbox.DBFrom(r.Context()); ok || !errors.Is(err, outbox.ErrNoTx) {
					t.Errorf("in a GET: DBFrom reported a transaction, or Publish returned %v", err)
				}
				w.WriteHeader(http.StatusBadRequest)
			})
			r.Post("/nested", func(w http.ResponseWriter, r *http.Request) {
				db := gormoutbox.DB(r.Context())
				f.publish(db, "outer")
				err := db.Transaction(func(tx *gorm.DB) error {
					f.createOrder(tx, "inner")
					f.publish(tx, "inner")
					return errAbort
				})
				if !errors.Is(err, errAbort) {
					t.Errorf("nested Transaction: %v", err)
				}
				w.WriteHeader(http.StatusCreated)
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
}

func TestTransactionalPanicsOnMisuse(t *testing.T) {
	f := setup(t, "sqlite", gorm.Config{})
	raw, err := gorm.Open(dialector("sqlite", f.sqlDB), &gorm.Config{Logger: f.db.Logger})
	if err != nil {
		t.Fatal(err)
	}
	mustPanic := func(what string, fn func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", what)
			}
		}()
		fn()
	}
	mustPanic("Transactional(nil)", func() { gormoutbox.Transactional(nil) })
	mustPanic("Transactional without the plugin", func() { gormoutbox.Transactional(raw) })
	tx := f.db.Begin()
	defer tx.Rollback()
	mustPanic("Transactional on a transaction", func() { gormoutbox.Transactional(tx) })
	mustPanic("DB without a transaction", func() { gormoutbox.DB(f.ctx) })
	f.expect()
}
