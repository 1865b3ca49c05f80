package amqpoutbox_test

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
	amqp "github.com/rabbitmq/amqp091-go"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// aenv is a queue of the test's own, and a database with the inbox
// tables, a business table and an Inbox that reports every result.
type aenv struct {
	tp    *topology
	conn  *amqp.Connection
	db    *sqlx.DB
	ib    *inbox.Inbox
	items string
	calls atomic.Int64

	mu   sync.Mutex
	cond *sync.Cond
	obs  []inbox.Observation
}

func newAenv(t *testing.T, dbName string, cfg inbox.Config) *aenv {
	t.Helper()
	e := &aenv{tp: newTopology(t, "")}
	e.cond = sync.NewCond(&e.mu)
	var err error
	if e.conn, err = amqp.Dial(e.tp.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close() })
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
	if e.ib, err = inbox.New(e.db.DB, cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *aenv) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	_, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
	return err
}

// publish sends one persistent message per id to the queue, id as
// message-id.
func (e *aenv) publish(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		err := e.tp.ch.PublishWithContext(context.Background(), "", e.tp.queue, false, false, amqp.Publishing{
			MessageId: id, Body: []byte("body of " + id), ContentType: "application/json", Headers: amqp.Table{"x-k": "v"},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func (e *aenv) consumer(t *testing.T, cfg amqpoutbox.ConsumerConfig) *amqpoutbox.Consumer {
	t.Helper()
	cfg.Inbox, cfg.Name, cfg.Conn, cfg.Queue = e.ib, "billing", e.conn, e.tp.queue
	if cfg.Handler == nil {
		cfg.Handler = e.apply
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 10 * time.Millisecond
	}
	c, err := amqpoutbox.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func (e *aenv) waitFor(t *testing.T, id string, r inbox.Result, n int) {
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

func (e *aenv) count(id string, r inbox.Result) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.countLocked(id, r)
}

func (e *aenv) countLocked(id string, r inbox.Result) int {
	n := 0
	for _, o := range e.obs {
		if o.Result == r && (id == "" || o.MessageID == id) {
			n++
		}
	}
	return n
}

func (e *aenv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM "+e.items); err != nil {
		t.Fatal(err)
	}
	return n
}

// closeAndCheckEmpty closes c and checks that the queue holds nothing:
// every message was acked (an unacked one is requeued at the close).
func (e *aenv) closeAndCheckEmpty(t *testing.T, c *amqpoutbox.Consumer) {
	t.Helper()
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := e.tp.count(t); n != 0 {
		t.Errorf("queue holds %d messages after the consumer closed, want 0", n)
	}
}

func eachAMQPDB(t *testing.T, fn func(t *testing.T, db string)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name)
		})
	}
}

// A process that committed a message's effect and died before its ack:
// the broker requeues the message when the channel goes, the consumer
// sees a duplicate and acks it; the effect is there once.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	eachAMQPDB(t, func(t *testing.T, db string) {
		e := newAenv(t, db, inbox.Config{})
		e.publish(t, "o-1")
		ch, err := e.conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		var d amqp.Delivery
		for ok := false; !ok; {
			if d, ok, err = ch.Get(e.tp.queue, false); err != nil {
				t.Fatal(err)
			}
		}
		if res, err := e.ib.Handle(context.Background(), "billing", inbox.Message{ID: d.MessageId}, e.apply); res != inbox.Applied {
			t.Fatalf("first process: %v %v", res, err)
		}
		ch.Close() // dies before the ack: the broker requeues

		c := e.consumer(t, amqpoutbox.ConsumerConfig{})
		e.waitFor(t, "o-1", inbox.Duplicate, 1)
		e.closeAndCheckEmpty(t, c)
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 {
			t.Errorf("business rows %d, handler calls %d; want 1, 1", n, calls)
		}
	})
}

// A handler that fails twice: the message is requeued and applied once.
func TestConsumerFailingHandlerAppliesOnceAfterRecovery(t *testing.T) {
	eachAMQPDB(t, func(t *testing.T, db string) {
		e := newAenv(t, db, inbox.Config{MaxAttempts: 5})
		var fails atomic.Int64
		c := e.consumer(t, amqpoutbox.ConsumerConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			if fails.Add(1) <= 2 {
				return errors.New("dependency down")
			}
			return nil
		}})
		e.publish(t, "f-1")
		e.waitFor(t, "f-1", inbox.Applied, 1)
		e.closeAndCheckEmpty(t, c)
		if n, failed := e.rows(t), e.count("f-1", inbox.Failed); n != 1 || failed != 2 {
			t.Errorf("business rows %d, failed attempts %d; want 1, 2", n, failed)
		}
	})
}

// A poison message is parked after MaxAttempts and acked; the consumer
// goes on; a message without any id is refused.
func TestConsumerPoisonParkedAndGoesOn(t *testing.T) {
	eachAMQPDB(t, func(t *testing.T, db string) {
		e := newAenv(t, db, inbox.Config{MaxAttempts: 2})
		c := e.consumer(t, amqpoutbox.ConsumerConfig{Concurrency: 1, Handler: func(ctx context.Context, m inbox.Message) error {
			if m.ID == "poison" {
				return errors.New("cannot decode")
			}
			return e.apply(ctx, m)
		}})
		e.publish(t, "poison", "good-1", "", "good-2")
		e.waitFor(t, "poison", inbox.Parked, 1)
		e.waitFor(t, "good-1", inbox.Applied, 1)
		e.waitFor(t, "good-2", inbox.Applied, 1)
		e.waitFor(t, "", inbox.Rejected, 1)
		e.closeAndCheckEmpty(t, c)
		parked, err := e.ib.Parked(context.Background(), inbox.ParkedFilter{Consumer: "billing"})
		if err != nil || len(parked) != 1 || parked[0].Message.ID != "poison" || string(parked[0].Message.Payload) != "body of poison" ||
			parked[0].Message.Headers["x-k"] != "v" || parked[0].LastError != "cannot decode" {
			t.Errorf("parked: %+v %v", parked, err)
		}
		if n := e.rows(t); n != 2 {
			t.Errorf("business rows %d, want 2", n)
		}
	})
}

// Closing a consumer in the middle of a backlog loses nothing.
func TestConsumerShutdownLosesNothing(t *testing.T) {
	eachAMQPDB(t, func(t *testing.T, db string) {
		e := newAenv(t, db, inbox.Config{})
		const n = 40
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("s-%02d", i)
		}
		e.publish(t, ids...)
		c := e.consumer(t, amqpoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, 10)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		c = e.consumer(t, amqpoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, n)
		e.closeAndCheckEmpty(t, c)
		if rows, applied, failed := e.rows(t), e.count("", inbox.Applied), e.count("", inbox.Failed); rows != n || applied != n || failed != 0 {
			t.Errorf("business rows %d, applied %d, failed %d; want %d, %d, 0", rows, applied, failed, n, n)
		}
	})
}
