// Command quickstart is the README's quick start: a chi service that writes
// an order and publishes its event in one transaction per request.
package main

import (
	"context"
	"log"
	"net/http"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // or _ "github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/txmw"
)

const OrderPlaced outbox.EventType = "OrderPlaced"

func main() {
	ctx := context.Background()
	// MySQL/MariaDB: sqlx.MustOpen("mysql", "app:pw@tcp(db:3306)/app?interpolateParams=true")
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN("quickstart.db"))
	db.MustExec(`CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`)

	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil { // creates the outbox table
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// A subscription: a stable name (the database tracks its deliveries),
	// a handler, the event types it takes.
	ob.Handle("log", func(ctx context.Context, ev outbox.Event) error {
		log.Printf("deliver %s %s %s", ev.Type, ev.ID, ev.JSON) // to Kafka, NATS, a webhook…
		return nil                                              // an error retries with back-off
	}, OrderPlaced)
	ob.Start(ctx)
	defer ob.Close(ctx) // drains the queues, waits for every goroutine

	r := chi.NewRouter()
	r.Use(chimw.Recoverer, txmw.Transactional(db, middleware.WithOutbox(ob)))
	r.Post("/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		ctx, id := r.Context(), chi.URLParam(r, "id")
		if _, err := txmw.Tx(ctx).ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (?, 'book')`, id); err != nil {
			http.Error(w, "order exists", http.StatusConflict) // not 2xx: rolled back, nothing published
			return
		}
		env := outbox.Envelope{Type: OrderPlaced, AggregateType: "order", AggregateID: id, JSON: []byte(`{"item":"book"}`)}
		if _, err := outbox.Publish(ctx, env); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated) // 2xx: commit, then the event goes to the listener
	})
	log.Print("listening on :8081; try: curl -i -X POST localhost:8081/orders/1")
	srv := &http.Server{Addr: ":8081", Handler: r}
	log.Print(srv.ListenAndServe())
}
