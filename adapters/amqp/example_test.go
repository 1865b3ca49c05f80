package amqpoutbox_test

import (
	"context"
	"log"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Deliver every event to the exchange "events" with its type as the
// routing key; an event no queue takes goes DEAD, an outage of RabbitMQ
// costs no attempts. (It needs a broker, so it has no Output.)
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "amqpoutbox")
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

	pub, err := amqpoutbox.New(amqpoutbox.Config{
		URL:        "amqp://guest:guest@127.0.0.1:5672/",
		Exchange:   "events",     // must exist
		RoutingKey: "app.{type}", // e.g. app.OrderPlaced
		Unroutable: amqpoutbox.UnroutablePermanent,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close() // after ob.Close: deferred calls run in reverse
	if err := ob.Subscribe(outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()}); err != nil {
		log.Fatal(err)
	}
	ob.Start(ctx)
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// ... the business write through tx ...
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", JSON: []byte(`{"id":42}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // published to RabbitMQ after this
		log.Fatal(err)
	}
}
