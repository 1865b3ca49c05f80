// Command inbox runs two services on SQLite: orders, which publishes an
// event through its outbox to a webhook, and billing, whose endpoint is a
// webhook.Receiver with an inbox. The first answer of billing is lost
// after its commit (the connection is cut), so the orders service sends
// the event again: billing answers the duplicate 200 and its invoice
// exists once.
//
//	go run ./inbox
package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// open returns a migrated SQLite database in dir (the outbox and inbox
// tables) with the given business table.
func open(ctx context.Context, dir, name, ddl string) (*sqlx.DB, *sqlstore.Store, error) {
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, name+".db")))
	if err != nil {
		return nil, nil, err
	}
	db.MustExec(ddl)
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return nil, nil, err
	}
	return db, store, store.Migrate(ctx)
}

func run() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "txoutbox-inbox")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	secret := webhook.NewSecret()

	// billing: a webhook endpoint with an inbox.
	bdb, _, err := open(ctx, dir, "billing", `CREATE TABLE invoices (order_id TEXT PRIMARY KEY, created_at TEXT NOT NULL)`)
	if err != nil {
		return err
	}
	defer bdb.Close()
	applied := make(chan inbox.Observation, 10)
	ib, err := inbox.New(bdb.DB, inbox.Config{Dialect: inbox.SQLite, Observe: func(o inbox.Observation) { applied <- o }})
	if err != nil {
		return err
	}
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{Inbox: ib, Name: "orders-events", Secrets: []string{secret},
		Handler: func(ctx context.Context, m inbox.Message) error {
			_, err := inbox.Tx(ctx).ExecContext(ctx, `INSERT INTO invoices (order_id, created_at) VALUES (?, ?)`,
				m.Headers["txoutbox-aggregate-id"], time.Now().UTC().Format(time.RFC3339))
			return err
		}})
	if err != nil {
		return err
	}
	var posts atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if posts.Add(1) == 1 {
			rc.ServeHTTP(httptest.NewRecorder(), r) // commits...
			panic(http.ErrAbortHandler)             // ...and the answer is lost
		}
		rc.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer srv.Shutdown(ctx)

	// orders: an outbox delivering to billing's endpoint.
	odb, store, err := open(ctx, dir, "orders", `CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
	if err != nil {
		return err
	}
	defer odb.Close()
	ob, err := outbox.New(store, outbox.Config{Retry: outbox.ExponentialBackoff{Base: 50 * time.Millisecond, Max: time.Second}})
	if err != nil {
		return err
	}
	pub, err := webhook.New(webhook.Config{URL: "http://" + ln.Addr().String() + "/hooks", Secret: secret})
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := ob.Subscribe(outbox.Subscription{Name: "to-billing", Handler: pub.Handler()}); err != nil {
		return err
	}
	if err := ob.Start(ctx); err != nil {
		return err
	}
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, odb.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (42, 'book')`); err != nil {
		return err
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "order.placed", AggregateType: "order", AggregateID: "42", JSON: []byte(`{"id":42}`)})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Printf("orders: published %s\n", id)

	for range 2 {
		select {
		case o := <-applied:
			fmt.Printf("billing: %s %s\n", o.MessageID, o.Result)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("billing got nothing within 30 s")
		}
	}
	var n int
	if err := bdb.Get(&n, `SELECT COUNT(*) FROM invoices WHERE order_id = '42'`); err != nil {
		return err
	}
	fmt.Printf("billing: %d invoice for order 42, after %d posts\n", n, posts.Load())
	if n != 1 {
		return fmt.Errorf("%d invoices, want 1", n)
	}
	return nil
}
