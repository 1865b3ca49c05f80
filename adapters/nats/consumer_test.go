package natsoutbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// ienv is a stream with a pull consumer, and a database with the inbox
// tables, a business table and an Inbox that reports every result.
type ienv struct {
	js    jetstream.JetStream
	ts    *testStream
	cons  jetstream.Consumer
	db    *sqlx.DB
	ib    *inbox.Inbox
	items string
	calls atomic.Int64

	mu   sync.Mutex
	cond *sync.Cond
	obs  []inbox.Observation
}

func newInboxEnv(t *testing.T, dbName string, cfg inbox.Config) *ienv {
	t.Helper()
	_, js := connect(t, testbroker.NATS(t))
	e := &ienv{js: js, ts: newStream(t, js, nil)}
	e.cond = sync.NewCond(&e.mu)
	ctx := context.Background()
	var err error
	e.cons, err = js.CreateOrUpdateConsumer(ctx, e.ts.name, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
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

// apply writes the message id as a business row in the handler's
// transaction.
func (e *ienv) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	_, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
	return err
}

func (e *ienv) publish(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		msg := &nats.Msg{Subject: e.ts.prefix + ".orders", Data: []byte("body of " + id), Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := e.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor waits until the inbox has reported n results r for id ("" for
// any id); the deadline only bounds a failing test.
func (e *ienv) waitFor(t *testing.T, id string, r inbox.Result, n int) {
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

func (e *ienv) count(id string, r inbox.Result) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.countLocked(id, r)
}

func (e *ienv) countLocked(id string, r inbox.Result) int {
	n := 0
	for _, o := range e.obs {
		if o.Result == r && (id == "" || o.MessageID == id) {
			n++
		}
	}
	return n
}

func (e *ienv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM "+e.items); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *ienv) consumer(t *testing.T, cfg natsoutbox.ConsumerConfig) *natsoutbox.Consumer {
	t.Helper()
	cfg.Inbox, cfg.Name, cfg.Consumer = e.ib, "billing", e.cons
	if cfg.Handler == nil {
		cfg.Handler = e.apply
	}
	c, err := natsoutbox.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// waitAcked waits until the server holds no message unacknowledged.
func (e *ienv) waitAcked(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := e.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer still has %d unacknowledged and %d pending messages", info.NumAckPending, info.NumPending)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func eachInboxDB(t *testing.T, fn func(t *testing.T, db string)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name)
		})
	}
}

// A process that committed a message's effect and died before its ack:
// the server redelivers the message after AckWait, the consumer sees a
// duplicate, acks it, and the effect is there once.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	eachInboxDB(t, func(t *testing.T, db string) {
		e := newInboxEnv(t, db, inbox.Config{})
		e.publish(t, "o-1")
		// The process that dies: it pulls, commits, and never acks.
		batch, err := e.cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg := <-batch.Messages()
		if msg == nil {
			t.Fatal("no message fetched")
		}
		res, err := e.ib.Handle(context.Background(), "billing", inbox.Message{ID: msg.Headers().Get(jetstream.MsgIDHeader)}, e.apply)
		if res != inbox.Applied {
			t.Fatalf("first process: %v %v", res, err)
		}
		// Its successor.
		e.consumer(t, natsoutbox.ConsumerConfig{})
		e.waitFor(t, "o-1", inbox.Duplicate, 1)
		e.waitAcked(t)
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 {
			t.Errorf("business rows %d, handler calls %d; want 1, 1", n, calls)
		}
	})
}

// A handler that fails twice and then recovers: the message is redelivered
// (NakWithDelay) and applied once.
func TestConsumerFailingHandlerAppliesOnceAfterRecovery(t *testing.T) {
	eachInboxDB(t, func(t *testing.T, db string) {
		e := newInboxEnv(t, db, inbox.Config{MaxAttempts: 5})
		var fails atomic.Int64
		e.consumer(t, natsoutbox.ConsumerConfig{RetryDelay: 10 * time.Millisecond, Handler: func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			if fails.Add(1) <= 2 {
				return errors.New("database of a dependency is down")
			}
			return nil
		}})
		e.publish(t, "f-1")
		e.waitFor(t, "f-1", inbox.Applied, 1)
		e.waitAcked(t)
		if n, failed := e.rows(t), e.count("f-1", inbox.Failed); n != 1 || failed != 2 {
			t.Errorf("business rows %d, failed attempts %d; want 1, 2", n, failed)
		}
	})
}

// A poison message is parked after MaxAttempts, acked, and the consumer
// goes on with the messages behind it.
func TestConsumerPoisonParkedAndGoesOn(t *testing.T) {
	eachInboxDB(t, func(t *testing.T, db string) {
		e := newInboxEnv(t, db, inbox.Config{MaxAttempts: 2})
		e.consumer(t, natsoutbox.ConsumerConfig{Concurrency: 1, RetryDelay: 10 * time.Millisecond, Handler: func(ctx context.Context, m inbox.Message) error {
			if m.ID == "poison" {
				return errors.New("cannot decode")
			}
			return e.apply(ctx, m)
		}})
		e.publish(t, "poison", "good-1", "good-2")
		e.waitFor(t, "poison", inbox.Parked, 1)
		e.waitFor(t, "good-2", inbox.Applied, 1)
		e.waitFor(t, "good-1", inbox.Applied, 1)
		e.waitAcked(t)
		parked, err := e.ib.Parked(context.Background(), inbox.ParkedFilter{Consumer: "billing"})
		if err != nil || len(parked) != 1 || parked[0].Message.ID != "poison" || string(parked[0].Message.Payload) != "body of poison" ||
			parked[0].LastError != "cannot decode" || parked[0].Message.Headers[jetstream.MsgIDHeader] != "poison" {
			t.Errorf("parked: %+v %v", parked, err)
		}
		if n := e.rows(t); n != 2 {
			t.Errorf("business rows %d, want 2", n)
		}
	})
}

// Closing a consumer in the middle of a backlog loses nothing: the
// messages it was handling finish, those it had pulled go back, and a
// new consumer applies the rest; every message is applied exactly once.
func TestConsumerShutdownLosesNothing(t *testing.T) {
	eachInboxDB(t, func(t *testing.T, db string) {
		e := newInboxEnv(t, db, inbox.Config{})
		const n = 40
		ids := make([]string, n)
		for i := range ids {
			ids[i] = "s-" + string(rune('A'+i/26)) + string(rune('a'+i%26))
		}
		e.publish(t, ids...)
		c := e.consumer(t, natsoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, 10)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if got := e.count("", inbox.Applied); got >= n {
			t.Logf("the first consumer applied all %d before Close", got)
		}
		e.consumer(t, natsoutbox.ConsumerConfig{Concurrency: 4})
		e.waitFor(t, "", inbox.Applied, n)
		e.waitAcked(t)
		if rows, applied := e.rows(t), e.count("", inbox.Applied); rows != n || applied != n {
			t.Errorf("business rows %d, applied %d; want %d, %d", rows, applied, n, n)
		}
		if failed := e.count("", inbox.Failed); failed != 0 {
			t.Errorf("%d failed handlings during a clean shutdown", failed)
		}
	})
}

// A message without any id is refused (Term) with a log line, unless
// DeriveID keys it by stream sequence.
func TestConsumerMessageWithoutID(t *testing.T) {
	e := newInboxEnv(t, "sqlite", inbox.Config{})
	e.consumer(t, natsoutbox.ConsumerConfig{DeriveID: true})
	if _, err := e.js.Publish(context.Background(), e.ts.prefix+".orders", []byte("anonymous")); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "", inbox.Applied, 1)
	e.waitAcked(t)
	e.mu.Lock()
	id := e.obs[0].MessageID
	e.mu.Unlock()
	if !strings.HasPrefix(id, "sha256:") {
		t.Errorf("derived id %q", id)
	}
}

func TestConsumerRefusesMessageWithoutID(t *testing.T) {
	e := newInboxEnv(t, "sqlite", inbox.Config{})
	e.consumer(t, natsoutbox.ConsumerConfig{})
	if _, err := e.js.Publish(context.Background(), e.ts.prefix+".orders", []byte("anonymous")); err != nil {
		t.Fatal(err)
	}
	e.waitAcked(t) // Term settles it
	if n := e.rows(t); n != 0 || e.calls.Load() != 0 {
		t.Errorf("a message without id was handled: %d rows", n)
	}
}

func TestNewConsumerRefusesBadConfig(t *testing.T) {
	if _, err := natsoutbox.NewConsumer(natsoutbox.ConsumerConfig{}); err == nil || !strings.Contains(err.Error(), "Inbox is nil") {
		t.Errorf("NewConsumer without an inbox: %v", err)
	}
}
