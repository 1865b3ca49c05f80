package redisoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// senv is a stream of the test's own, and a database with the inbox
// tables, a business table and an Inbox that reports every result.
type senv struct {
	rdb    *redis.Client
	stream string
	db     *sqlx.DB
	ib     *inbox.Inbox
	items  string
	calls  atomic.Int64

	mu   sync.Mutex
	cond *sync.Cond
	obs  []inbox.Observation
}

func newSenv(t *testing.T, dbName string, cfg inbox.Config) *senv {
	t.Helper()
	e := &senv{rdb: newClient(t, testbroker.Redis(t))}
	e.stream = prefix(t, e.rdb) + "orders"
	e.cond = sync.NewCond(&e.mu)
	e.db = testdb.Open(t, dbName)
	store := testdb.Store(t, e.db)
	e.items = testdb.TableName("items")
	if _, err := e.db.Exec("CREATE TABLE " + e.items + " (id VARCHAR(255) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, e.db, e.items) })
	cfg.Dialect, _ = inbox.DialectNamed(store.Dialect().Name())
	cfg.Table = strings.Trim(store.Table(), "`\"")
	cfg.Observe = func(o inbox.Observation) {
		e.mu.Lock()
		e.obs = append(e.obs, o)
		e.mu.Unlock()
		e.cond.Broadcast()
	}
	var err error
	if e.ib, err = inbox.New(e.db.DB, cfg); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupCreateMkStream(context.Background(), e.stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *senv) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	_, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
	return err
}

func (e *senv) add(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: e.stream, Values: []any{meta.ID, id, "payload", "body of " + id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *senv) consumer(t *testing.T, cfg redisoutbox.ConsumerConfig) *redisoutbox.Consumer {
	t.Helper()
	cfg.Inbox, cfg.Name, cfg.Client, cfg.Stream, cfg.Group = e.ib, "billing", e.rdb, e.stream, "billing"
	if cfg.Handler == nil {
		cfg.Handler = e.apply
	}
	cfg.Block = cmpOr(cfg.Block, 100*time.Millisecond)
	cfg.ClaimIdle = cmpOr(cfg.ClaimIdle, 200*time.Millisecond)
	c, err := redisoutbox.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func (e *senv) waitFor(t *testing.T, id string, r inbox.Result, n int) {
	t.Helper()
	timer := time.AfterFunc(30*time.Second, e.cond.Broadcast)
	defer timer.Stop()
	start := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.countLocked(id, r) < n {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("waited 30 s for %d %v of %q; results: %v", n, r, id, e.obs)
		}
		e.cond.Wait()
	}
}

func (e *senv) count(id string, r inbox.Result) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.countLocked(id, r)
}

func (e *senv) countLocked(id string, r inbox.Result) int {
	n := 0
	for _, o := range e.obs {
		if o.Result == r && (id == "" || o.MessageID == id) {
			n++
		}
	}
	return n
}

func (e *senv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM "+e.items); err != nil {
		t.Fatal(err)
	}
	return n
}

// closeAndCheckAcked closes c and checks that the group has nothing
// pending: every entry was acked.
func (e *senv) closeAndCheckAcked(t *testing.T, c *redisoutbox.Consumer) {
	t.Helper()
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p, err := e.rdb.XPending(context.Background(), e.stream, "billing").Result()
	if err != nil {
		t.Fatal(err)
	}
	if p.Count != 0 {
		t.Errorf("%d entries pending after the consumer closed, want 0", p.Count)
	}
}

func eachRedisDB(t *testing.T, fn func(t *testing.T, db string)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name)
		})
	}
}

// A member that committed an entry's effect and died before its XACK:
// another member claims the entry (XAUTOCLAIM), the inbox sees a
// duplicate, and the entry is acked; the effect is there once.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, db string) {
		e := newSenv(t, db, inbox.Config{})
		e.add(t, "o-1")
		ctx := context.Background()
		streams, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{e.stream, ">"}, Count: 1}).Result()
		if err != nil || len(streams) != 1 || len(streams[0].Messages) != 1 {
			t.Fatalf("read: %v %v", streams, err)
		}
		if res, err := e.ib.Handle(ctx, "billing", inbox.Message{ID: "o-1"}, e.apply); res != inbox.Applied {
			t.Fatalf("dead member: %v %v", res, err)
		}
		c := e.consumer(t, redisoutbox.ConsumerConfig{})
		e.waitFor(t, "o-1", inbox.Duplicate, 1)
		e.closeAndCheckAcked(t, c)
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 {
			t.Errorf("business rows %d, handler calls %d; want 1, 1", n, calls)
		}
	})
}

// A handler that fails twice: the entry stays pending, is claimed again
// and applied once.
func TestConsumerFailingHandlerAppliesOnceAfterRecovery(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, db string) {
		e := newSenv(t, db, inbox.Config{MaxAttempts: 5})
		var fails atomic.Int64
		c := e.consumer(t, redisoutbox.ConsumerConfig{ClaimIdle: 50 * time.Millisecond, Handler: func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			if fails.Add(1) <= 2 {
				return errors.New("dependency down")
			}
			return nil
		}})
		e.add(t, "f-1")
		e.waitFor(t, "f-1", inbox.Applied, 1)
		e.closeAndCheckAcked(t, c)
		if n, failed := e.rows(t), e.count("f-1", inbox.Failed); n != 1 || failed != 2 {
			t.Errorf("business rows %d, failed attempts %d; want 1, 2", n, failed)
		}
	})
}

// A poison entry is parked after MaxAttempts and acked; the consumer goes
// on.
func TestConsumerPoisonParkedAndGoesOn(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, db string) {
		e := newSenv(t, db, inbox.Config{MaxAttempts: 2})
		c := e.consumer(t, redisoutbox.ConsumerConfig{ClaimIdle: 50 * time.Millisecond, Handler: func(ctx context.Context, m inbox.Message) error {
			if m.ID == "poison" {
				return errors.New("cannot decode")
			}
			return e.apply(ctx, m)
		}})
		e.add(t, "poison", "good-1", "good-2")
		e.waitFor(t, "poison", inbox.Parked, 1)
		e.waitFor(t, "good-1", inbox.Applied, 1)
		e.waitFor(t, "good-2", inbox.Applied, 1)
		e.closeAndCheckAcked(t, c)
		parked, err := e.ib.Parked(context.Background(), inbox.ParkedFilter{Consumer: "billing"})
		if err != nil || len(parked) != 1 || parked[0].Message.ID != "poison" || string(parked[0].Message.Payload) != "body of poison" ||
			parked[0].Message.Headers[meta.ID] != "poison" || parked[0].LastError != "cannot decode" {
			t.Errorf("parked: %+v %v", parked, err)
		}
		if n := e.rows(t); n != 2 {
			t.Errorf("business rows %d, want 2", n)
		}
	})
}

// Closing a member in the middle of a backlog loses nothing: what it read
// and did not start stays pending and the next member claims it.
func TestConsumerShutdownLosesNothing(t *testing.T) {
	eachRedisDB(t, func(t *testing.T, db string) {
		e := newSenv(t, db, inbox.Config{})
		const n = 40
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("s-%02d", i)
		}
		e.add(t, ids...)
		c := e.consumer(t, redisoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, 10)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		c = e.consumer(t, redisoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, n)
		e.closeAndCheckAcked(t, c)
		if rows, applied, failed := e.rows(t), e.count("", inbox.Applied), e.count("", inbox.Failed); rows != n || applied != n || failed != 0 {
			t.Errorf("business rows %d, applied %d, failed %d; want %d, %d, 0", rows, applied, failed, n, n)
		}
	})
}
