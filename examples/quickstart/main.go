// Command quickstart is the README's quick start: a chi service that writes
// an order and publishes its event in one transaction per request.
package main

import (
	"cmp"
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	// Ctrl-C or SIGTERM ends this context; the outbox gets one that outlives
	// it, so that Close can still deliver what is queued.
	stopped, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx := context.Background()

	// MySQL/MariaDB: sqlx.MustOpen("mysql", "app:pw@tcp(db:3306)/app?interpolateParams=true")
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN("quickstart.db"))
	defer db.Close() // runs last: after the outbox is closed
	db.MustExec(`CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, item VARCHAR(100) NOT NULL)`)

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
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}

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
		w.WriteHeader(http.StatusCreated) // 2xx: commit, then the event goes to the handler
	})

	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("ADDR"), ":8081"))
	if err != nil { // the address is taken, say
		ob.Close(ctx)
		log.Fatal(err)
	}
	// The timeouts bound slow clients (docs/operations.md, "Starting and stopping").
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Printf("listening on %s; try: curl -i -X POST localhost:8081/orders/1", ln.Addr())
	select {
	case err := <-served:
		ob.Close(ctx)
		log.Fatal(err)
	case <-stopped.Done():
	}
	stop() // a second Ctrl-C kills at once

	// Finish the requests in flight, then deliver what is queued and stop.
	log.Print("shutting down")
	shutdown, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Print(err)
	}
	if err := ob.Close(shutdown); err != nil {
		log.Fatal(err)
	}
}
