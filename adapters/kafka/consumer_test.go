package kafkaoutbox_test

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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// kenv is a kfake cluster with a topic of three partitions, and a
// database with the inbox tables, a business table and an Inbox that
// reports every result.
type kenv struct {
	c     *kfake.Cluster
	topic string
	group string
	db    *sqlx.DB
	ib    *inbox.Inbox
	items string
	calls atomic.Int64

	mu   sync.Mutex
	cond *sync.Cond
	obs  []inbox.Observation
}

func newKenv(t *testing.T, dbName string, cfg inbox.Config) *kenv {
	t.Helper()
	e := &kenv{c: cluster(t), topic: topicName(t), group: "billing"}
	e.cond = sync.NewCond(&e.mu)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(client(t, e.addr(), "")).CreateTopic(ctx, 3, 1, nil, e.topic)
	if err == nil {
		err = resp.Err
	}
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

func (e *kenv) addr() string { return e.c.ListenAddrs()[0] }

func (e *kenv) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	_, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
	return err
}

// produce writes one record per id, keyed by id, with the txoutbox-id
// header.
func (e *kenv) produce(t *testing.T, ids ...string) {
	t.Helper()
	cl := client(t, e.addr(), "")
	for _, id := range ids {
		r := &kgo.Record{Topic: e.topic, Key: []byte(id), Value: []byte("body of " + id), Headers: []kgo.RecordHeader{{Key: meta.ID, Value: []byte(id)}}}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// groupClient is a consumer of the group, as the Consumer requires it.
func (e *kenv) groupClient(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr()), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func (e *kenv) consumer(t *testing.T, cl *kgo.Client, cfg kafkaoutbox.ConsumerConfig) *kafkaoutbox.Consumer {
	t.Helper()
	cfg.Inbox, cfg.Name, cfg.Client = e.ib, "billing", cl
	if cfg.Handler == nil {
		cfg.Handler = e.apply
	}
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = func(int) time.Duration { return 10 * time.Millisecond }
	}
	c, err := kafkaoutbox.NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()); cl.Close() })
	return c
}

func (e *kenv) waitFor(t *testing.T, id string, r inbox.Result, n int) {
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

func (e *kenv) count(id string, r inbox.Result) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.countLocked(id, r)
}

func (e *kenv) countLocked(id string, r inbox.Result) int {
	n := 0
	for _, o := range e.obs {
		if o.Result == r && (id == "" || o.MessageID == id) {
			n++
		}
	}
	return n
}

func (e *kenv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM "+e.items); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCommitted waits until the group's committed offsets add up to n
// records.
func (e *kenv) waitCommitted(t *testing.T, n int64) {
	t.Helper()
	adm := kadm.NewClient(client(t, e.addr(), ""))
	deadline := time.Now().Add(20 * time.Second)
	for {
		offs, err := adm.FetchOffsets(context.Background(), e.group)
		var sum int64
		if err == nil {
			offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		}
		if sum == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group committed %d records (%v), want %d", sum, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func eachKafkaDB(t *testing.T, fn func(t *testing.T, db string)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name)
		})
	}
}

// A member that committed a record's effect and died before committing
// its offset: the group's next member gets the record again, the inbox
// sees a duplicate, and the offset moves on; the effect is there once.
func TestConsumerCrashBetweenCommitAndOffsetCommit(t *testing.T) {
	eachKafkaDB(t, func(t *testing.T, db string) {
		e := newKenv(t, db, inbox.Config{})
		e.produce(t, "o-1")
		first := e.groupClient(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var rec *kgo.Record
		for rec == nil {
			f := first.PollRecords(ctx, 1)
			if ctx.Err() != nil {
				t.Fatal("no record polled")
			}
			if recs := f.Records(); len(recs) > 0 {
				rec = recs[0]
			}
		}
		res, err := e.ib.Handle(ctx, "billing", inbox.Message{ID: "o-1", Payload: rec.Value}, e.apply)
		if res != inbox.Applied {
			t.Fatalf("first member: %v %v", res, err)
		}
		first.AllowRebalance()
		first.Close() // dies without committing the offset

		e.consumer(t, e.groupClient(t), kafkaoutbox.ConsumerConfig{})
		e.waitFor(t, "o-1", inbox.Duplicate, 1)
		e.waitCommitted(t, 1)
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 {
			t.Errorf("business rows %d, handler calls %d; want 1, 1", n, calls)
		}
	})
}

// A handler that fails twice: the record is retried in place and applied
// once, and the records behind it in its partition wait for it.
func TestConsumerFailingHandlerAppliesOnceAfterRecovery(t *testing.T) {
	eachKafkaDB(t, func(t *testing.T, db string) {
		e := newKenv(t, db, inbox.Config{MaxAttempts: 5})
		var fails atomic.Int64
		e.consumer(t, e.groupClient(t), kafkaoutbox.ConsumerConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			if m.ID == "f-1" && fails.Add(1) <= 2 {
				return errors.New("dependency down")
			}
			return nil
		}})
		e.produce(t, "f-1")
		e.waitFor(t, "f-1", inbox.Applied, 1)
		e.waitCommitted(t, 1)
		if n, failed := e.rows(t), e.count("f-1", inbox.Failed); n != 1 || failed != 2 {
			t.Errorf("business rows %d, failed attempts %d; want 1, 2", n, failed)
		}
	})
}

// A poison record is parked after MaxAttempts, its offset committed, and
// the consumer goes on.
func TestConsumerPoisonParkedAndGoesOn(t *testing.T) {
	eachKafkaDB(t, func(t *testing.T, db string) {
		e := newKenv(t, db, inbox.Config{MaxAttempts: 3})
		e.consumer(t, e.groupClient(t), kafkaoutbox.ConsumerConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			if m.ID == "poison" {
				return errors.New("cannot decode")
			}
			return e.apply(ctx, m)
		}})
		e.produce(t, "poison", "good-1", "good-2")
		e.waitFor(t, "poison", inbox.Parked, 1)
		e.waitFor(t, "good-1", inbox.Applied, 1)
		e.waitFor(t, "good-2", inbox.Applied, 1)
		e.waitCommitted(t, 3)
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

// Closing a member in the middle of a backlog loses nothing: what it
// handled is committed, the rest goes to the next member, and every
// record is applied exactly once.
func TestConsumerShutdownLosesNothing(t *testing.T) {
	eachKafkaDB(t, func(t *testing.T, db string) {
		e := newKenv(t, db, inbox.Config{})
		const n = 60
		ids := make([]string, n)
		for i := range ids {
			ids[i] = fmt.Sprintf("s-%02d", i)
		}
		e.produce(t, ids...)
		cl := e.groupClient(t)
		c := e.consumer(t, cl, kafkaoutbox.ConsumerConfig{MaxPollRecords: 5})
		e.waitFor(t, "", inbox.Applied, 10)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		cl.Close()
		e.consumer(t, e.groupClient(t), kafkaoutbox.ConsumerConfig{})
		e.waitFor(t, "", inbox.Applied, n)
		e.waitCommitted(t, n)
		if rows, applied, failed := e.rows(t), e.count("", inbox.Applied), e.count("", inbox.Failed); rows != n || applied != n || failed != 0 {
			t.Errorf("business rows %d, applied %d, failed %d; want %d, %d, 0", rows, applied, failed, n, n)
		}
	})
}

// A record without a txoutbox-id is keyed by its coordinates by default.
func TestConsumerDerivesIDFromCoordinates(t *testing.T) {
	e := newKenv(t, "sqlite", inbox.Config{})
	if err := client(t, e.addr(), "").ProduceSync(context.Background(), &kgo.Record{Topic: e.topic, Partition: 0, Value: []byte("x")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.consumer(t, e.groupClient(t), kafkaoutbox.ConsumerConfig{})
	e.waitFor(t, "", inbox.Applied, 1)
	e.mu.Lock()
	id := e.obs[0].MessageID
	e.mu.Unlock()
	if !strings.HasPrefix(id, "sha256:") {
		t.Errorf("derived id %q", id)
	}
}

func TestNewConsumerRequiresManualCommits(t *testing.T) {
	e := newKenv(t, "sqlite", inbox.Config{})
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr()), kgo.ConsumerGroup("g"), kgo.ConsumeTopics(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	_, err = kafkaoutbox.NewConsumer(kafkaoutbox.ConsumerConfig{Inbox: e.ib, Name: "x", Client: cl, Handler: e.apply})
	if err == nil || !strings.Contains(err.Error(), "kgo.DisableAutoCommit()") {
		t.Errorf("NewConsumer with auto-commit: %v", err)
	}
}
