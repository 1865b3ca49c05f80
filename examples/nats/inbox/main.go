// Command inbox consumes order events from NATS JetStream into a billing
// database with the inbox: each message is applied once, in a SQLite
// transaction with its inbox row, and acked after the commit. It then
// resets the JetStream consumer, so that the stream is delivered again,
// and shows that the redelivered messages are duplicates.
//
//	go run ./inbox [-nats nats://127.0.0.1:4222]
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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS server URL (JetStream enabled)")
	flag.Parse()
	if err := run(*url, "EXAMPLE_INBOX_"+outbox.NewID()); err != nil {
		log.Fatal(err)
	}
}

func run(url, streamName string) error {
	ctx := context.Background()
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	subject := "example.inbox." + streamName
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: streamName, Subjects: []string{subject}, Storage: jetstream.MemoryStorage}); err != nil {
		return fmt.Errorf("create the stream: %w", err)
	}
	defer js.DeleteStream(context.WithoutCancel(ctx), streamName)
	// The orders service's events, as natsoutbox publishes them.
	for _, id := range []string{"41", "42", "43"} {
		msg := nats.NewMsg(subject)
		msg.Header.Set(jetstream.MsgIDHeader, "evt-order-"+id)
		msg.Data = []byte(id)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			return err
		}
	}

	// billing: SQLite with the outbox and inbox tables, and its invoices.
	dir, err := os.MkdirTemp("", "txoutbox-nats-inbox")
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

	// Two passes over the stream: the second, after a consumer reset,
	// delivers every message again.
	for pass := 1; pass <= 2; pass++ {
		cons, err := js.CreateOrUpdateConsumer(ctx, streamName, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			return err
		}
		c, err := natsoutbox.NewConsumer(natsoutbox.ConsumerConfig{Inbox: ib, Name: "billing", Consumer: cons, Handler: invoice})
		if err != nil {
			return err
		}
		if err := c.Start(ctx); err != nil {
			return err
		}
		for range 3 {
			select {
			case o := <-results:
				fmt.Printf("pass %d: %s %s\n", pass, o.MessageID, o.Result)
			case <-time.After(30 * time.Second):
				c.Close(ctx)
				return fmt.Errorf("pass %d: no message within 30 s", pass)
			}
		}
		if err := c.Close(ctx); err != nil {
			return err
		}
		if err := js.DeleteConsumer(ctx, streamName, "billing"); err != nil {
			return err
		}
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM invoices`); err != nil {
		return err
	}
	fmt.Printf("billing: %d invoices for 3 orders delivered twice\n", n)
	if n != 3 {
		return fmt.Errorf("%d invoices, want 3", n)
	}
	return nil
}
