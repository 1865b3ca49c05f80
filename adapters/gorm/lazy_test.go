package gormoutbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
	"github.com/go-chi/chi/v5"
	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/middleware"
)

// TestTransactionBeginsAtFirstUse: with a pool of one connection, a
// request whose handler has not used its transaction yet (it waits, as
// one reading a slow client's body does) holds no connection, so another
// request gets it; when the pool is exhausted, the first use answers 503
// and the handler goes no further (issue 37, item 1).
func TestTransactionBeginsAtFirstUse(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name, gorm.Config{})
			f.sqlDB.SetMaxOpenConns(1)
			entered, release := make(chan struct{}), make(chan struct{})
			r := chi.NewRouter()
			r.Use(gormoutbox.Transactional(f.db, middleware.WithOutbox(f.ob), middleware.WithBeginTimeout(100*time.Millisecond)))
			var wentOn atomic.Bool
			r.Post("/orders/{customer}", func(w http.ResponseWriter, r *http.Request) {
				customer := chi.URLParam(r, "customer")
				if customer == "slow" {
					close(entered)
					<-release
				}
				db := gormoutbox.DB(r.Context())
				wentOn.Store(customer == "refused")
				f.createOrder(db, customer)
				f.publish(db, "placed")
				w.WriteHeader(http.StatusCreated)
			})
			srv := httptest.NewServer(r)
			defer srv.Close()
			e := httpexpect.Default(t, srv.URL)

			slow := make(chan int, 1)
			go func() {
				resp, err := srv.Client().Post(srv.URL+"/orders/slow", "text/plain", nil)
				if err != nil {
					slow <- 0
					return
				}
				resp.Body.Close()
				slow <- resp.StatusCode
			}()
			<-entered
			e.POST("/orders/fast").Expect().Status(http.StatusCreated)
			close(release)
			if code := <-slow; code != http.StatusCreated {
				t.Fatalf("slow request: %d, want 201", code)
			}

			conn, err := f.sqlDB.Conn(context.Background()) // the only connection
			if err != nil {
				t.Fatal(err)
			}
			e.POST("/orders/refused").Expect().Status(http.StatusServiceUnavailable).Header("Retry-After").IsEqual("1")
			conn.Close()
			if wentOn.Load() {
				t.Error("the handler went on past a failed begin")
			}
			if got := f.customers(); len(got) != 2 || got[0] != "fast" || got[1] != "slow" {
				t.Errorf("orders %v, want fast and slow", got)
			}
		})
	}
}
