package natsoutbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Events published in a transaction go to the ORDERS stream after the
// commit, on the subject "orders.{type}". It needs a NATS server with
// JetStream on localhost.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "natsoutbox-example")
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

	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain() // after ob.Close (defers run last-in first-out)
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// The duplicate window covers the subscription's retry span, so that
	// JetStream stores a retried event once.
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: 5 * time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}

	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: "orders.{type}", ShortWindow: natsoutbox.WindowRefuse})
	if err != nil {
		log.Fatal(err)
	}
	sub := outbox.Subscription{Name: "orders-to-nats", Batch: pub.Handler()}
	if err := pub.Check(ctx, sub, ob.Config()); err != nil { // the stream's duplicate window covers the retries
		log.Fatal(err)
	}
	if err := ob.Subscribe(sub); err != nil {
		log.Fatal(err)
	}
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ob.Close(ctx) // before nc.Drain

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "order.placed", AggregateType: "order", AggregateID: "42", JSON: []byte(`{"item":"book"}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"orders.order.placed"}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		log.Fatal(err)
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			log.Fatal(err)
		}
		if msg.Headers().Get("txoutbox-id") == id {
			fmt.Printf("%s %s\n", msg.Subject(), msg.Data())
			break
		}
	}
}
