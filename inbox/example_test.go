package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// A message is applied once: its handler writes a row and publishes an
// event in the same transaction as the inbox row; a redelivery is a
// duplicate, and a message that keeps failing is parked.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	db.MustExec(`CREATE TABLE payments (order_id TEXT PRIMARY KEY)`)
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil { // the inbox tables too
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer ob.Close(ctx)
	ib, err := inbox.New(db.DB, inbox.Config{Dialect: inbox.SQLite, MaxAttempts: 2})
	if err != nil {
		log.Fatal(err)
	}

	pay := func(ctx context.Context, m inbox.Message) error {
		if string(m.Payload) == "garbage" {
			return errors.New("cannot decode")
		}
		if _, err := inbox.Tx(ctx).ExecContext(ctx, `INSERT INTO payments (order_id) VALUES (?)`, string(m.Payload)); err != nil {
			return err
		}
		_, err := outbox.Publish(outbox.NewContext(ctx, ob), outbox.Envelope{Type: "payment.recorded", JSON: []byte(`{}`)})
		return err
	}
	msg := inbox.Message{ID: "01J-order-42-placed", Payload: []byte("42")}
	for range 2 { // delivered twice
		res, err := ib.Handle(ctx, "payments", msg, pay)
		fmt.Println(res, err, res.Settled())
	}
	bad := inbox.Message{ID: "01J-bad", Payload: []byte("garbage")}
	for range 2 {
		res, err := ib.Handle(ctx, "payments", bad, pay)
		fmt.Println(res, err, res.Settled())
	}
	parked, _ := ib.Parked(ctx, inbox.ParkedFilter{Consumer: "payments"})
	fmt.Println(len(parked), parked[0].Message.ID, parked[0].LastError)
	// Output:
	// applied <nil> true
	// duplicate <nil> true
	// failed cannot decode false
	// parked cannot decode true
	// 1 01J-bad cannot decode
}
