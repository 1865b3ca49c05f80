package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

const OrderPlaced outbox.EventType = "OrderPlaced"

// A business write and its event in one transaction; after the commit the
// listener runs.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	db.MustExec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)

	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	delivered := make(chan struct{})
	ob.Handle("log", func(ctx context.Context, ev outbox.Event) error {
		fmt.Printf("%s %s (attempt %d, %s path)\n", ev.Type, ev.JSON, ev.Attempt, ev.Path)
		close(delivered)
		return nil
	}, OrderPlaced)

	ob.Start(ctx)
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (42, 'book')`); err != nil {
		log.Fatal(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type:          OrderPlaced,
		AggregateType: "order",
		AggregateID:   "42",
		JSON:          []byte(`{"id":42,"item":"book"}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // the listener runs only after this
		log.Fatal(err)
	}
	<-delivered
	// Output: OrderPlaced {"id":42,"item":"book"} (attempt 1, hot path)
}

// Publish finds the transaction in the context: middleware puts it there
// (txmw.Transactional), and so can your own code.
func ExamplePublish() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, _ := outbox.New(store, outbox.Config{})
	defer ob.Close(ctx)

	// Without a transaction, Publish fails fast and writes nothing.
	_, err := outbox.Publish(outbox.NewContext(ctx, ob), outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{}`)})
	fmt.Println(err)

	tx, _ := outbox.BeginTx(ctx, db.DB, nil)
	ctx = txctx.With(outbox.NewContext(ctx, ob), tx)
	id, err := outbox.Publish(ctx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"id":7}`)})
	fmt.Println(len(id), err)
	tx.Commit()
	// Output:
	// outbox: no transaction in context; wrap the handler with txmw.Transactional (or an adapter's middleware), or use PublishTx
	// 26 <nil>
}

// PublishAll writes several events of one unit of work in one statement:
// all of them, or none if one is invalid.
func ExamplePublishAll() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, _ := outbox.New(store, outbox.Config{})
	defer ob.Close(ctx)

	tx, _ := outbox.BeginTx(ctx, db.DB, nil)
	ctx = txctx.With(outbox.NewContext(ctx, ob), tx)
	_, err := outbox.PublishAll(ctx,
		outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"id":7}`)},
		outbox.Envelope{Type: "StockReserved"}) // no payload
	fmt.Println(err)
	ids, err := outbox.PublishAll(ctx,
		outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"id":7}`)},
		outbox.Envelope{Type: "StockReserved", JSON: []byte(`{"sku":"book"}`)})
	fmt.Println(len(ids), err)
	tx.Commit()
	stats, _ := store.Stats(context.Background())
	fmt.Println("rows:", stats.New+stats.Done)
	// Output:
	// outbox: envelope 1 of 2: outbox: invalid envelope: JSON: a payload is required: set JSON or Bytes
	// 2 <nil>
	// rows: 2
}

// Invalid envelopes are refused with an error that names the field and
// never repeats the payload.
func ExampleValidationError() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	store.Migrate(ctx)
	ob, _ := outbox.New(store, outbox.Config{})
	defer ob.Close(ctx)
	tx, _ := outbox.BeginTx(ctx, db.DB, nil)
	defer tx.Rollback()
	_, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"card":"4111-1111`)})
	fmt.Println(err)
	_, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, Bytes: make([]byte, outbox.MaxPayloadBytes+1)})
	fmt.Println(err)
	// Output:
	// outbox: invalid envelope: JSON: payload is not valid JSON (18 bytes)
	// outbox: invalid envelope: Bytes: payload is 1048577 bytes, over the limit of 1048576 bytes (1 MiB)
}
