// Command inbox consumes order events from Kafka into a billing database
// with the inbox: a kafkaoutbox.Consumer applies each record once, in a
// SQLite transaction with its inbox row, and commits the group's offsets
// only after the database commit. The first member dies after applying a
// record and before committing its offset; the second member gets the
// record again, sees a duplicate, and moves on.
//
//	go run ./inbox
//
// It runs on franz-go's in-process Kafka (kfake).
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	_ "modernc.org/sqlite" // driver "sqlite"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		return err
	}
	defer cluster.Close()
	addr := cluster.ListenAddrs()[0]
	prod, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer prod.Close()
	for _, id := range []string{"41", "42", "43"} {
		r := &kgo.Record{Topic: "orders", Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "txoutbox-id", Value: []byte("evt-order-" + id)}}}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			return err
		}
	}

	// billing: SQLite with the outbox and inbox tables, and its invoices.
	dir, err := os.MkdirTemp("", "txoutbox-kafka-inbox")
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
	member := func() (*kgo.Client, error) {
		return kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
			kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	}

	// The first member applies the first record and dies before it
	// commits the offset.
	first, err := member()
	if err != nil {
		return err
	}
	var rec *kgo.Record
	for rec == nil {
		if recs := first.PollRecords(ctx, 1).Records(); len(recs) > 0 {
			rec = recs[0]
		}
	}
	res, err := ib.Handle(ctx, "billing", inbox.Message{ID: "evt-order-" + string(rec.Value), Payload: rec.Value}, invoice)
	if err != nil {
		return err
	}
	o := <-results
	fmt.Printf("first member: %s %s, then dies\n", o.MessageID, res)
	first.AllowRebalance()
	first.Close()

	// The second member gets every record, the first one again.
	cl, err := member()
	if err != nil {
		return err
	}
	defer cl.Close()
	c, err := kafkaoutbox.NewConsumer(kafkaoutbox.ConsumerConfig{Inbox: ib, Name: "billing", Client: cl, Handler: invoice})
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
			fmt.Printf("second member: %s %s\n", o.MessageID, o.Result)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("no record within 30 s")
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
