package kafkaoutbox_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// topicName returns a topic name unique to this test run.
func topicName(t testing.TB) string {
	n := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return strings.ToLower(n + "." + outbox.NewID()[14:])
}

// cluster starts an in-process Kafka (franz-go's kfake) with one broker;
// it stops when t ends. No Kafka server runs on the test machines: kfake
// speaks the real protocol, with the real produce checks (sizes,
// idempotent sequence numbers).
func cluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// client returns a producer client for addr, closed when t ends. With
// via set, every connection (whatever broker the metadata names) goes to
// via: the proxy of an outage test.
func client(t testing.TB, addr, via string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(addr), kgo.ProducerLinger(time.Millisecond)}
	if via != "" {
		base = append(base,
			kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, via)
			}),
			kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
			kgo.DialTimeout(time.Second),
		)
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("kgo: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopic creates topic on c with the given configs (nil for none).
func createTopic(t testing.TB, c *kfake.Cluster, topic string, configs map[string]*string) {
	t.Helper()
	cl := client(t, c.ListenAddrs()[0], "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// endOffset is the number of records written to partition 0 of topic.
func endOffset(t testing.TB, c *kfake.Cluster, topic string) int64 {
	t.Helper()
	cl := client(t, c.ListenAddrs()[0], "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("end offsets of %s: %v", topic, err)
	}
	o, ok := offs.Lookup(topic, 0)
	if !ok || o.Err != nil {
		t.Fatalf("end offset of %s: %v %v", topic, ok, o.Err)
	}
	return o.Offset
}

// consume reads the first n records of topic (every partition), failing
// the test when they do not come within 15s.
func consume(t testing.TB, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := client(t, c.ListenAddrs()[0], "",
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consume %s: %d of %d records: %v", topic, len(recs), n, ctx.Err())
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("fetch: %v", err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// engine is an outbox on SQLite with one subscription, started; it is
// closed when t ends.
type engine struct {
	ob    *outbox.Outbox
	db    *sqlx.DB
	store *sqlstore.Store
	sub   string
}

func newEngine(t testing.TB, sub outbox.Subscription, cfg outbox.Config) *engine {
	t.Helper()
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	ob, err := outbox.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Subscribe(sub); err != nil {
		t.Fatal(err)
	}
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ob.Close(ctx)
	})
	return &engine{ob: ob, db: db, store: store, sub: sub.Name}
}

// publish writes envs in one transaction and commits it (or rolls it back
// when commit is false); it returns the events' ids.
func (e *engine) publish(t testing.TB, commit bool, envs ...outbox.Envelope) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, e.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ids := make([]string, len(envs))
	for i, env := range envs {
		id, err := e.ob.PublishTx(ctx, tx, env)
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		ids[i] = id
	}
	if commit {
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// state is the subscription's delivery state of one event.
type state struct {
	Status   outbox.Status
	Attempts int
	Err      string
}

func (e *engine) state(t testing.TB, id string) state {
	t.Helper()
	rec, err := e.store.Inspect(context.Background(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == e.sub {
			return state{d.Status, d.Attempts, d.LastError}
		}
	}
	return state{rec.Status, rec.Attempts, rec.LastError}
}

// waitFinal polls until every event is DONE or DEAD for the subscription
// (no signal exists for it) and returns their states.
func (e *engine) waitFinal(t testing.TB, timeout time.Duration, ids ...string) map[string]state {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := map[string]state{}
		pending := 0
		for _, id := range ids {
			s := e.state(t, id)
			out[id] = s
			if s.Status != outbox.StatusDone && s.Status != outbox.StatusDead {
				pending++
			}
		}
		if pending == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events not delivered after %v", pending, len(ids), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
