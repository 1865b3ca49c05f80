// Command inbox consumes order entries from a Redis stream into a billing
// database with the inbox: a redisoutbox.Consumer applies each entry
// once, in a SQLite transaction with its inbox row, and XACKs it only
// after the commit. A first member reads an entry, applies it and dies
// before its XACK; the consumer claims the pending entry (XAUTOCLAIM)
// and sees a duplicate.
//
//	go run ./inbox [-addr localhost:6379]
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
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // driver "sqlite"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	addr := flag.String("addr", "localhost:6379", "Redis address")
	flag.Parse()
	if err := run(*addr); err != nil {
		log.Fatal(err)
	}
}

func run(addr string) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	stream := "txoutbox-example-inbox:" + outbox.NewID()
	defer rdb.Del(context.WithoutCancel(ctx), stream)
	if err := rdb.XGroupCreateMkStream(ctx, stream, "billing", "0").Err(); err != nil {
		return err
	}
	for _, id := range []string{"41", "42", "43"} {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"txoutbox-id", "evt-order-" + id, "payload", id}}).Err(); err != nil {
			return err
		}
	}

	// billing: SQLite with the outbox and inbox tables, and its invoices.
	dir, err := os.MkdirTemp("", "txoutbox-redis-inbox")
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

	// A member that reads the first entry, applies it, and dies before
	// its XACK: the entry stays pending.
	streams, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dying", Streams: []string{stream, ">"}, Count: 1}).Result()
	if err != nil {
		return err
	}
	x := streams[0].Messages[0]
	id := fmt.Sprint(x.Values["txoutbox-id"])
	res, err := ib.Handle(ctx, "billing", inbox.Message{ID: id, Payload: []byte(fmt.Sprint(x.Values["payload"]))}, invoice)
	if err != nil {
		return err
	}
	<-results
	fmt.Printf("first member: %s %s, then dies\n", id, res)

	c, err := redisoutbox.NewConsumer(redisoutbox.ConsumerConfig{Inbox: ib, Name: "billing", Client: rdb, Stream: stream, Group: "billing",
		Handler: invoice, ClaimIdle: 500 * time.Millisecond, Block: 200 * time.Millisecond})
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
			return fmt.Errorf("no entry within 30 s")
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
