package kafkaoutbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// An event published in a transaction is produced to Kafka after the
// commit. Here Kafka is franz-go's in-process kfake; with a real cluster,
// only the seed brokers change.
func Example() {
	ctx := context.Background()
	kafka, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer kafka.Close()

	dir, _ := os.MkdirTemp("", "kafkaoutbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// The producer: the client stays yours; close it after the outbox.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	pub, err := kafkaoutbox.New(cl, kafkaoutbox.Config{Topic: "orders"})
	if err != nil {
		log.Fatal(err)
	}

	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "to-kafka", Batch: pub.Handler()}); err != nil {
		log.Fatal(err)
	}
	ob.Start(ctx)
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{
		Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", JSON: []byte(`{"id":42}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// A consumer.
	cons, err := kgo.NewClient(kgo.SeedBrokers(kafka.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer cons.Close()
	for {
		recs := cons.PollFetches(ctx).Records()
		if len(recs) > 0 {
			r := recs[0]
			fmt.Printf("key=%s value=%s type=%s\n", r.Key, r.Value, r.Headers[1].Value)
			return
		}
	}
	// Output: key=order:42 value={"id":42} type=OrderPlaced
}
