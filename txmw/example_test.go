package txmw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/txmw"
)

// A handler writes an order and publishes order.placed through the
// request's transaction; the listener runs after the 201 is committed.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "txmw-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "shop.db")))
	defer db.Close()
	db.SetMaxOpenConns(1) // SQLite has one writer; let writers queue in the pool
	db.MustExec("CREATE TABLE orders (id TEXT PRIMARY KEY)")

	store, _ := sqlstore.New(db, sqlstore.Options{})
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	ob, _ := outbox.New(store, outbox.Config{})
	delivered := make(chan string, 1)
	ob.Handle("log", func(ctx context.Context, ev outbox.Event) error {
		delivered <- ev.AggregateID
		return nil
	}, "order.placed")

	ob.Start(ctx)
	defer ob.Close(ctx)

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if _, err := txmw.Tx(r.Context()).ExecContext(r.Context(), "INSERT INTO orders (id) VALUES (?)", id); err != nil {
			http.Error(w, err.Error(), http.StatusConflict) // 409: rolled back
			return
		}
		payload, _ := json.Marshal(map[string]string{"id": id})
		if _, err := outbox.Publish(r.Context(), outbox.Envelope{
			Type: "order.placed", AggregateType: "order", AggregateID: id, JSON: payload,
		}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated) // commit, then hooks, then the 201
		fmt.Fprintf(w, "order %s placed", id)
	})
	h := txmw.Transactional(db, middleware.WithOutbox(ob))(mux)

	for _, id := range []string{"42", "42"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders/"+id, nil))
		fmt.Println(rec.Code)
	}
	fmt.Println("delivered:", <-delivered)
	var n int
	db.Get(&n, "SELECT COUNT(*) FROM orders")
	fmt.Println("orders:", n)
	// Output:
	// 201
	// 409
	// delivered: 42
	// orders: 1
}
