// Command amqp publishes one event through the outbox to RabbitMQ and
// prints the message a consumer receives.
//
//	go run . # RabbitMQ at amqp://guest:guest@127.0.0.1:5672/, or set AMQP_URL
//
// It declares a topic exchange "txoutbox-example" (auto-deleted) and a temporary queue
// bound to it, opens the outbox on SQLite (in a temporary directory),
// subscribes the RabbitMQ connector, publishes an OrderPlaced event in
// the transaction that writes the order, and waits for it on the queue.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite" // driver "sqlite"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

const exchange = "txoutbox-example"

func main() {
	url := os.Getenv("AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url); err != nil {
		log.Fatal(err)
	}
}

func run(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The consumer's side: an exchange and a queue for order events.
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// Auto-deleted with its last binding, the temporary queue's.
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil) // temporary
	if err != nil {
		return err
	}
	if err := ch.QueueBind(q.Name, "order.*", exchange, false, nil); err != nil {
		return err
	}
	msgs, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}

	// The service's side: SQLite, the outbox, the connector.
	dir, err := os.MkdirTemp("", "txoutbox-amqp-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	db.MustExec(`CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`)
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		return err
	}
	pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url, Exchange: exchange, RoutingKey: "order.{type}"})
	if err != nil {
		return err
	}
	defer pub.Close() // runs after ob.Close
	if err := ob.Subscribe(outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()}); err != nil {
		return err
	}
	if err := ob.Start(ctx); err != nil {
		return err
	}
	defer ob.Close(context.Background())

	// The order and its event, in one transaction.
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ('42', 'book')`); err != nil {
		return err
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type: "OrderPlaced", AggregateType: "order", AggregateID: "42",
		JSON:    []byte(`{"id":"42","item":"book"}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Printf("published %s\n", id)

	select {
	case d := <-msgs:
		fmt.Printf("received on %s (routing key %s): message-id %s, type %s, content-type %s\n",
			d.Exchange, d.RoutingKey, d.MessageId, d.Type, d.ContentType)
		for _, k := range []string{"txoutbox-id", "txoutbox-type", "txoutbox-aggregate-type", "txoutbox-aggregate-id", "txoutbox-occurred-at", "content-type", "traceparent"} {
			fmt.Printf("  %s: %v\n", k, d.Headers[k])
		}
		fmt.Printf("  body: %s\n", d.Body)
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no message from RabbitMQ: %w", ctx.Err())
	}
}
