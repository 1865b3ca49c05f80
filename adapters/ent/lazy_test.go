package entoutbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gavv/httpexpect/v2"
	"github.com/go-chi/chi/v5"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/middleware"
)

// TestTransactionBeginsAtFirstUse: with a pool of one connection, a
// request whose handler has not used its transaction yet (it waits, as
// one reading a slow client's body does) holds no connection, so another
// request gets it; when the pool is exhausted, the first use answers 503
// and the handler goes no further (issue 37, item 1).
func TestTransactionBeginsAtFirstUse(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		f.sx.SetMaxOpenConns(1)
		entered, release := make(chan struct{}), make(chan struct{})
		r := chi.NewRouter()
		r.Use(entoutbox.Transactional(f.client, middleware.WithOutbox(f.ob), middleware.WithBeginTimeout(100*time.Millisecond)))
		var wentOn atomic.Bool
		r.Post("/orders/{customer}", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			customer := chi.URLParam(r, "customer")
			if customer == "slow" {
				close(entered)
				<-release
			}
			tx := entoutbox.Tx[*testent.Tx](ctx)
			wentOn.Store(customer == "refused")
			f.createOrder(ctx, tx, customer)
			f.publish(ctx, "placed")
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

		conn, err := f.sx.Conn(context.Background()) // the only connection
		if err != nil {
			t.Fatal(err)
		}
		e.POST("/orders/refused").Expect().Status(http.StatusServiceUnavailable).Header("Retry-After").IsEqual("1")
		conn.Close()
		if wentOn.Load() {
			t.Error("the handler went on past a failed begin")
		}
		if got := f.customers(); !slices.Equal(got, []string{"fast", "slow"}) {
			t.Errorf("orders %v, want fast and slow", got)
		}
	})
}
