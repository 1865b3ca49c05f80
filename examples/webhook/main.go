// Command webhook posts an outbox event to an HTTP endpoint, signed the
// Standard Webhooks way: it starts a receiver on a loopback port (the
// other service, usually) that checks the signature with webhook.Verify,
// writes an order and its event in one SQLite transaction, and prints
// what the receiver got.
//
//	go run .
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	secret := webhook.NewSecret() // the receiver's; it hands it out once

	// The receiver.
	received := make(chan string, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge) // 413: the event goes dead
			return
		}
		if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Delivery is at least once: a real receiver de-duplicates on
		// webhook-id (a unique key in its own database) before acting.
		var b strings.Builder
		fmt.Fprintf(&b, "POST %s\n", r.URL.Path)
		for _, k := range []string{"Webhook-Id", "Webhook-Timestamp", "Txoutbox-Type", "Txoutbox-Aggregate-Type", "Txoutbox-Aggregate-Id", "Txoutbox-Occurred-At", "Content-Type", "Traceparent"} {
			fmt.Fprintf(&b, "%s: %s\n", k, r.Header.Get(k))
		}
		fmt.Fprintf(&b, "signature verified; body: %s", body)
		w.WriteHeader(http.StatusNoContent)
		select {
		case received <- b.String():
		default:
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()

	// The service: an SQLite database with its orders and the outbox.
	dir, err := os.MkdirTemp("", "txoutbox-webhook")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		return err
	}
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		return err
	}

	pub, err := webhook.New(webhook.Config{
		URL:          "http://" + ln.Addr().String() + "/hooks/orders", // from configuration, never from events
		Secret:       secret,
		Timeout:      5 * time.Second,
		MaxBodyBytes: 1 << 20, // what the receiver takes
	})
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := ob.Subscribe(outbox.Subscription{Name: "orders-webhook", Handler: pub.Handler(), Types: []outbox.EventType{"order.placed"}}); err != nil {
		return err
	}
	if err := ob.Start(ctx); err != nil {
		return err
	}
	defer ob.Close(ctx)

	// One transaction: the order and its event, or neither.
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ('42', 'book')`); err != nil {
		return err
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type: "order.placed", AggregateType: "order", AggregateID: "42",
		JSON:    []byte(`{"id":"42","item":"book"}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil { // the POST happens only after this
		return err
	}
	fmt.Printf("published %s\n", id)

	select {
	case got := <-received:
		fmt.Println(got)
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("event %s not received within 30s", id)
	}
}
