// Command nats publishes one event in a SQLite transaction and receives it
// from NATS JetStream, delivered by the natsoutbox connector.
//
//	go run . [-nats nats://127.0.0.1:4222] [-db example.db]
//
// It creates (or updates) the stream EXAMPLE_ORDERS on the subjects
// "example.orders.>", with a duplicate window that covers the outbox's
// retry span.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS server URL (JetStream enabled)")
	dbPath := flag.String("db", "natsexample.db", "SQLite database file")
	flag.Parse()
	if err := run(*url, *dbPath); err != nil {
		log.Fatal(err)
	}
}

func run(url, dbPath string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// The application's database, with the outbox table in it.
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(dbPath))
	if err != nil {
		return err
	}
	defer db.Close()
	db.MustExec(`CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`)
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

	// NATS: reconnect for ever; the outbox waits (circuit open, no
	// attempts spent) while the connection is down.
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return err
	}
	defer nc.Drain() // runs after ob.Close: the outbox stops publishing first
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       "EXAMPLE_ORDERS",
		Subjects:   []string{"example.orders.>"},
		Duplicates: natsoutbox.RetrySpan(outbox.Subscription{}, ob.Config()) + time.Minute,
	})
	if err != nil {
		return fmt.Errorf("create the stream: %w", err)
	}

	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: "example.orders.{type}", ShortWindow: natsoutbox.WindowRefuse})
	if err != nil {
		return err
	}
	sub := outbox.Subscription{Name: "orders-to-nats", Batch: pub.Handler()}
	if err := pub.Check(ctx, sub, ob.Config()); err != nil { // the stream's duplicate window covers the retries
		return err
	}
	if err := ob.Subscribe(sub); err != nil {
		return err
	}
	if err := ob.Start(ctx); err != nil {
		return err
	}
	defer ob.Close(context.Background())

	// The business write and its event, in one transaction.
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (item) VALUES ('book')`)
	if err != nil {
		return err
	}
	orderID, _ := res.LastInsertId()
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type:          "placed",
		AggregateType: "order",
		AggregateID:   fmt.Sprint(orderID),
		JSON:          fmt.Appendf(nil, `{"id":%d,"item":"book"}`, orderID),
		Headers:       map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil { // the event goes to NATS after this
		return err
	}
	fmt.Printf("published event %s in the transaction of order %d\n", id, orderID)

	// A consumer: read the stream until our event arrives.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"example.orders.placed"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		msg, err := cons.Next(jetstream.FetchMaxWait(time.Until(deadline)))
		if err != nil {
			return fmt.Errorf("waiting for the event: %w", err)
		}
		if msg.Headers().Get("txoutbox-id") != id {
			continue
		}
		fmt.Printf("received on %s: %s\n", msg.Subject(), msg.Data())
		for _, k := range []string{"Nats-Msg-Id", "txoutbox-id", "txoutbox-type", "txoutbox-aggregate-type", "txoutbox-aggregate-id", "txoutbox-occurred-at", "content-type", "traceparent"} {
			fmt.Printf("  %s: %s\n", k, msg.Headers().Get(k))
		}
		return nil
	}
	return fmt.Errorf("event %s not received within 10s", id)
}
