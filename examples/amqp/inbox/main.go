// Command inbox consumes order messages from a RabbitMQ queue into a
// billing database with the inbox: an amqpoutbox.Consumer applies each
// message once, in a SQLite transaction with its inbox row, and acks it
// only after the commit. A first process takes a message, applies it and
// dies before its ack; RabbitMQ requeues the message, and the consumer
// sees a duplicate.
//
//	go run ./inbox [-amqp amqp://guest:guest@localhost:5672/]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
	_ "modernc.org/sqlite" // driver "sqlite"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	url := flag.String("amqp", "amqp://guest:guest@localhost:5672/", "RabbitMQ URL")
	flag.Parse()
	if err := run(*url); err != nil {
		log.Fatal(err)
	}
}

func run(url string) error {
	ctx := context.Background()
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	queue := "txoutbox-example-inbox-" + outbox.NewID()
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil {
		return err
	}
	for _, id := range []string{"41", "42", "43"} {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{MessageId: "evt-order-" + id, Body: []byte(id)}); err != nil {
			return err
		}
	}

	// billing: SQLite with the outbox and inbox tables, and its invoices.
	dir, err := os.MkdirTemp("", "txoutbox-amqp-inbox")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "billing.db")))
	if err != nil {
		return err
	}
	defer db.Close()
	db.MustExec(`CREATE TABLE invoices (order_id TEXT PRIMARY KEY)`)
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	results := make(chan inbox.Observation, 10)
	ib, err := inbox.New(db.DB, inbox.Config{Dialect: inbox.SQLite, Observe: func(o inbox.Observation) { results <- o }})
	if err != nil {
		return err
	}
	invoice := func(ctx context.Context, m inbox.Message) error {
		_, err := inbox.Tx(ctx).ExecContext(ctx, `INSERT INTO invoices (order_id) VALUES (?)`, string(m.Payload))
		return err
	}

	// A process that takes the first message, applies it, and dies
	// before its ack: closing its channel requeues the message.
	dying, err := conn.Channel()
	if err != nil {
		return err
	}
	d, ok, err := dying.Get(queue, false)
	if err != nil || !ok {
		return fmt.Errorf("get: %v (got a message: %v)", err, ok)
	}
	res, err := ib.Handle(ctx, "billing", inbox.Message{ID: d.MessageId, Payload: d.Body}, invoice)
	if err != nil {
		return err
	}
	<-results
	fmt.Printf("first process: %s %s, then dies\n", d.MessageId, res)
	dying.Close()

	c, err := amqpoutbox.NewConsumer(amqpoutbox.ConsumerConfig{Inbox: ib, Name: "billing", Conn: conn, Queue: queue, Handler: invoice})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Close(ctx)
	for range 3 {
		select {
		case o := <-results:
			fmt.Printf("consumer: %s %s\n", o.MessageID, o.Result)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no message within 30 s")
		}
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM invoices`); err != nil {
		return err
	}
	fmt.Printf("billing: %d invoices for 3 orders\n", n)
	if n != 3 {
		return fmt.Errorf("%d invoices, want 3", n)
	}
	return nil
}
