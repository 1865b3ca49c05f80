// Command kafka publishes one event in a transaction on SQLite and
// delivers it to Kafka with the kafkaoutbox connector, then reads it back
// from the topic and prints it.
//
//	go run . -brokers localhost:9092 -topic orders
//
// Without -brokers (or $KAFKA_BROKERS) it starts franz-go's in-process
// Kafka (kfake), so that it runs anywhere.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite" // driver "sqlite"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated seed brokers; empty: an in-process kfake cluster")
	topic := flag.String("topic", "orders", "the topic to produce to (must exist, or the cluster must create topics)")
	flag.Parse()
	if err := run(*brokers, *topic); err != nil {
		log.Fatal(err)
	}
}

func run(brokers, topic string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	seeds := strings.Split(brokers, ",")
	if brokers == "" {
		kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
		if err != nil {
			return err
		}
		defer kafka.Close()
		seeds = kafka.ListenAddrs()
		log.Printf("no -brokers: using an in-process Kafka (kfake) at %v", seeds)
	}

	dir, err := os.MkdirTemp("", "txoutbox-kafka")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	db.MustExec(`CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`)
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}

	// The producer client is ours: idempotent writes stay on (the default).
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close() // after the outbox's Close (defers run last-in first-out)
	pub, err := kafkaoutbox.New(cl, kafkaoutbox.Config{Topic: topic})
	if err != nil {
		return err
	}

	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		return err
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "to-kafka", Batch: pub.Handler()}); err != nil {
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
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ('42', 'book')`); err != nil {
		return err
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type: "OrderPlaced", AggregateType: "order", AggregateID: "42",
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		JSON:    []byte(`{"id":"42","item":"book"}`),
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	log.Printf("committed order 42 and event %s", id)

	// A consumer reads the topic until it sees the event.
	cons, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cons.Close()
	for {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("event %s not received: %w", id, err)
		}
		for _, r := range fs.Records() {
			var got string
			for _, h := range r.Headers {
				if h.Key == "txoutbox-id" {
					got = string(h.Value)
				}
			}
			if got != id {
				continue
			}
			fmt.Printf("received from %s[%d]@%d key=%s value=%s\n", r.Topic, r.Partition, r.Offset, r.Key, r.Value)
			for _, h := range r.Headers {
				fmt.Printf("  %s: %s\n", h.Key, h.Value)
			}
			return nil
		}
	}
}
