package webhook_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// An event committed with a business write is posted, signed, to an
// endpoint; the receiver checks the signature with Verify.
func Example() {
	ctx := context.Background()
	secret := webhook.NewSecret() // shared with the receiver

	// The receiver (another service, usually).
	got := make(chan string, 1)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header, body, 0); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Delivery is at least once: de-duplicate on r.Header.Get("webhook-id").
		w.WriteHeader(http.StatusNoContent)
		select {
		case got <- fmt.Sprintf("%s %s", r.Header.Get("txoutbox-type"), body):
		default:
		}
	}))
	defer rcv.Close()

	dir, _ := os.MkdirTemp("", "webhook-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := webhook.New(webhook.Config{URL: rcv.URL + "/hooks/orders", Secret: secret})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	if err := ob.Subscribe(outbox.Subscription{Name: "orders-webhook", Handler: pub.Handler()}); err != nil {
		log.Fatal(err)
	}
	ob.Start(ctx)
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "order.placed", JSON: []byte(`{"id":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-got)
	// Output: order.placed {"id":42}
}
