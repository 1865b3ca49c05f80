package redisoutbox_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/redis/go-redis/v9"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// TestMain fails the run if an outbox goroutine outlives the tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }

// newClient returns a client of addr with small timeouts, closed when the
// test ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:         addr,
		DialTimeout:  300 * time.Millisecond,
		ReadTimeout:  300 * time.Millisecond,
		WriteTimeout: 300 * time.Millisecond,
		PoolTimeout:  300 * time.Millisecond,
		MaxRetries:   -1, // the outbox retries, and knows what an attempt is
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// prefix returns a prefix of keys unique to this test run, and deletes
// every key under it when the test ends.
func prefix(t testing.TB, rdb *redis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	p := "txoutbox-test-" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, "*"+p+"*", 100).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("scan %s*: %v", p, err)
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("del %v: %v", keys, err)
			}
		}
	})
	return p
}

// fixture is one test's world: Redis (direct or through a proxy), a fresh
// outbox table on SQLite, an outbox with the publisher subscribed.
type fixture struct {
	t      testing.TB
	ctx    context.Context
	rdb    *redis.Client // direct to the shared server, for assertions
	db     *sqlx.DB
	store  *sqlstore.Store
	ob     *outbox.Outbox
	pub    *redisoutbox.Publisher
	prefix string
	stream string // prefix + "events", the default stream of the fixture
}

type setupOpts struct {
	addr string // the client's address; default the shared server
	sub  outbox.Subscription
	cfg  redisoutbox.Config // Stream defaults to the fixture's
	wrap func(outbox.BatchHandler) outbox.BatchHandler
}

func setup(t testing.TB, so setupOpts) *fixture {
	t.Helper()
	addr := testbroker.Redis(t)
	f := &fixture{t: t, ctx: context.Background()}
	f.rdb = newClient(t, addr)
	f.prefix = prefix(t, f.rdb)
	f.stream = f.prefix + "events"
	if so.addr == "" {
		so.addr = addr
	}
	client := f.rdb
	if so.addr != addr {
		client = newClient(t, so.addr)
	}
	var err error
	cfg := so.cfg
	if cfg.Stream == "" && cfg.StreamTemplate == "" {
		cfg.Stream = f.stream
	}
	f.pub, err = redisoutbox.New(client, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.db = testdb.SQLite(t)
	f.store = testdb.Store(t, f.db)
	f.ob, err = outbox.New(f.store, outbox.Config{PollInterval: 20 * time.Millisecond, PollMaxInterval: 100 * time.Millisecond, Retry: fixedRetry(20 * time.Millisecond)})
	if err != nil {
		t.Fatalf("outbox.New: %v", err)
	}
	sub := so.sub
	if sub.Name == "" {
		sub.Name = "to-redis"
	}
	h := f.pub.Handler()
	if so.wrap != nil {
		h = so.wrap(h)
	}
	sub.Batch = h
	if err := f.ob.Subscribe(sub); err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	if err := f.ob.Start(f.ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.ob.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

type fixedRetry time.Duration

func (d fixedRetry) Delay(int) time.Duration { return time.Duration(d) }

// publish publishes envs in one committed transaction and returns their ids.
func (f *fixture) publish(envs ...outbox.Envelope) []string {
	f.t.Helper()
	tx, err := outbox.BeginTx(f.ctx, f.db.DB, nil)
	if err != nil {
		f.t.Fatalf("BeginTx: %v", err)
	}
	defer tx.Rollback()
	ids := make([]string, len(envs))
	for i, env := range envs {
		if ids[i], err = f.ob.PublishTx(f.ctx, tx, env); err != nil {
			f.t.Fatalf("PublishTx: %v", err)
		}
	}
	if err := tx.Commit(); err != nil {
		f.t.Fatalf("Commit: %v", err)
	}
	return ids
}

// outcome is an event's delivery state for the fixture's one subscription.
type outcome struct {
	status    outbox.Status // StatusDone, StatusDead, or what is pending
	attempts  int
	lastError string
}

func (f *fixture) outcome(id string) outcome {
	f.t.Helper()
	rec, err := f.store.Inspect(f.ctx, id)
	if err != nil {
		f.t.Fatalf("Inspect %s: %v", id, err)
	}
	if rec.Status != outbox.StatusSplit || len(rec.Deliveries) == 0 {
		return outcome{rec.Status, rec.Attempts, rec.LastError}
	}
	d := rec.Deliveries[0]
	return outcome{d.Status, d.Attempts, d.LastError}
}

// settled waits until every id is done or dead, and returns their outcomes.
func (f *fixture) settled(ids []string, within time.Duration) map[string]outcome {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out := map[string]outcome{}
		pending := 0
		for _, id := range ids {
			o := f.outcome(id)
			out[id] = o
			if o.status != outbox.StatusDone && o.status != outbox.StatusDead {
				pending++
			}
		}
		if pending == 0 {
			return out
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d of %d events not settled after %v", pending, len(ids), within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// entry is one stream entry with its fields in order.
type entry struct {
	ID     string
	Fields [][2]string
}

func (e entry) get(k string) string {
	for _, kv := range e.Fields {
		if kv[0] == k {
			return kv[1]
		}
	}
	return ""
}

// entries reads a whole stream, keeping the order of the fields.
func (f *fixture) entries(stream string) []entry {
	f.t.Helper()
	v, err := f.rdb.Do(f.ctx, "XRANGE", stream, "-", "+").Slice()
	if err != nil {
		f.t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]entry, len(v))
	for i, x := range v {
		pair := x.([]any)
		out[i].ID = pair[0].(string)
		kv := pair[1].([]any)
		for j := 0; j+1 < len(kv); j += 2 {
			out[i].Fields = append(out[i].Fields, [2]string{kv[j].(string), kv[j+1].(string)})
		}
	}
	return out
}

// waitLen waits until stream has at least n entries (XREAD blocks until
// an entry arrives, so this is a signal, not a sleep) and returns them.
func (f *fixture) waitLen(stream string, n int, within time.Duration) []entry {
	f.t.Helper()
	deadline := time.Now().Add(within)
	last := "0"
	for {
		es := f.entries(stream)
		if len(es) >= n {
			return es
		}
		if len(es) > 0 {
			last = es[len(es)-1].ID
		}
		left := time.Until(deadline)
		if left <= 0 {
			f.t.Fatalf("stream %s has %d entries after %v, want %d", stream, len(es), within, n)
		}
		block := min(left, 250*time.Millisecond) // under the client's read timeout
		ctx, cancel := context.WithTimeout(f.ctx, left)
		err := f.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Block: block}).Err()
		cancel()
		if err != nil && err != redis.Nil && !strings.Contains(err.Error(), "timeout") {
			f.t.Fatalf("XREAD %s: %v", stream, err)
		}
	}
}

func describe(es []entry) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%s %v\n", e.ID, e.Fields)
	}
	return b.String()
}
