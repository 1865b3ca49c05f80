// Command redis publishes one event in a transaction on SQLite and reads
// it back from the Redis stream the redisoutbox connector added it to.
//
//	go run . [-addr localhost:6379] [-stream example:orders]
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
	_ "modernc.org/sqlite"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	addr := flag.String("addr", "localhost:6379", "Redis address")
	stream := flag.String("stream", "txoutbox-example:orders", "stream key")
	flag.Parse()
	if err := run(*addr, *stream); err != nil {
		log.Fatal(err)
	}
}

func run(addr, stream string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dir, err := os.MkdirTemp("", "txoutbox-redis-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		return err
	}
	defer db.Close()
	db.MustExec(`CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`)
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}

	// Small timeouts: a Redis that does not answer fails the call quickly
	// and the outbox's circuit holds the events until it is back.
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second})
	defer rdb.Close()
	pub, err := redisoutbox.New(rdb, redisoutbox.Config{Stream: stream, MaxLen: 100000, IdempotentTTL: 24 * time.Hour})
	if err != nil {
		return err
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		return err
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "to-redis", Batch: pub.Handler()}); err != nil {
		return err
	}
	if err := ob.Start(ctx); err != nil {
		return err
	}
	defer ob.Close(context.Background())

	// Where the stream ends now: read only what comes after.
	last := "$"
	if res, err := rdb.XRevRangeN(ctx, stream, "+", "-", 1).Result(); err == nil && len(res) == 1 {
		last = res[0].ID
	} else if err == nil {
		last = "0"
	}

	// The business write and the event, in one transaction.
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
		JSON:    []byte(`{"item":"book"}`),
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Printf("published %s\n", id)

	// A consumer: read the stream, de-duplicate on txoutbox-id.
	for {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: time.Second}).Result()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("XREAD %s: %w", stream, err)
		}
		for _, s := range res {
			for _, m := range s.Messages {
				last = m.ID
				if m.Values["txoutbox-id"] != id {
					continue
				}
				fmt.Printf("received %s from stream %s:\n", m.ID, stream)
				for _, k := range []string{"txoutbox-id", "txoutbox-type", "txoutbox-aggregate-type", "txoutbox-aggregate-id", "txoutbox-occurred-at", "content-type", "traceparent", "payload"} {
					fmt.Printf("  %s: %v\n", k, m.Values[k])
				}
				return nil
			}
		}
	}
}
