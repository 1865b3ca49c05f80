package redisoutbox_test

import (
	"context"
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

// An event published in a transaction becomes an entry of the stream
// "example:OrderPlaced" after the commit. It needs a Redis server on
// localhost:6379.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "redisoutbox-example")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer db.Close()
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer rdb.Close() // after ob.Close
	pub, err := redisoutbox.New(rdb, redisoutbox.Config{StreamTemplate: "example:${type}", MaxLen: 10000})
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "to-redis", Batch: pub.Handler()}); err != nil {
		log.Fatal(err)
	}
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ob.Close(ctx)

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// … the business write through tx …
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", JSON: []byte(`{"item":"book"}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// A consumer reads the stream (here from the start, with XREAD; a
	// service would use a consumer group) and de-duplicates on txoutbox-id.
	for last := "0"; ; {
		res, err := rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{"example:OrderPlaced", last}, Block: 500 * time.Millisecond}).Result()
		if err != nil && err != redis.Nil {
			log.Fatal(err)
		}
		for _, s := range res {
			for _, m := range s.Messages {
				last = m.ID
				if m.Values["txoutbox-id"] == id {
					fmt.Printf("%s %s\n", m.Values["txoutbox-type"], m.Values["payload"])
					rdb.Del(ctx, "example:OrderPlaced")
					return
				}
			}
		}
	}
}
