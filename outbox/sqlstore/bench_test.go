package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkPublishCommit measures business transactions that publish one
// event each (an order-sized JSON payload) and commit, with delivery on the
// hot path; one op is one transaction, and the timer covers delivering
// every event. `make bench` runs the full comparison (bench/).
func BenchmarkPublishCommit(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql"} {
		b.Run(name, func(b *testing.B) {
			db := testdb.Open(b, name)
			st := testdb.Store(b, db)
			ob, err := outbox.New(st, outbox.Config{})
			if err != nil {
				b.Fatal(err)
			}
			waitAll := countDeliveries(ob, b.N)
			ctx := context.Background()
			ob.Start(ctx)
			payload := []byte(`{"order_id":"01HZX","customer":"ada","items":[{"sku":"book","qty":2,"price_cents":1250}],"total_cents":2500,"currency":"EUR"}`)
			b.SetParallelism(4)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					publishOne(b, ctx, db, ob, payload)
				}
			})
			waitAll(b, time.Minute)
			ob.Close(ctx)
		})
	}
}

// countDeliveries counts every delivery of ob. The function it returns
// waits (at most timeout) until n events were delivered, stops the timer
// and reports events/s.
func countDeliveries(ob *outbox.Outbox, n int) func(b *testing.B, timeout time.Duration) {
	c := newDrainCount(n)
	ob.Handle("all", func(context.Context, outbox.Event) error {
		c.add(1)
		return nil
	})
	return c.wait
}

// drainCount counts the deliveries of a drain of n events.
type drainCount struct {
	n         int64
	delivered atomic.Int64
	all       chan struct{} // closed at the n-th
}

func newDrainCount(n int) *drainCount {
	return &drainCount{n: int64(n), all: make(chan struct{})}
}

func (c *drainCount) add(k int) {
	if c.delivered.Add(int64(k)) == c.n {
		close(c.all)
	}
}

// wait waits for the n deliveries, up to timeout, stops the timer and
// reports events/s over the time measured.
func (c *drainCount) wait(b *testing.B, timeout time.Duration) {
	select {
	case <-c.all:
	case <-time.After(timeout):
		b.Fatalf("delivered %d of %d", c.delivered.Load(), c.n)
	}
	b.StopTimer()
	b.ReportMetric(float64(c.n)/b.Elapsed().Seconds(), "events/s")
}

func publishOne(b *testing.B, ctx context.Context, db *sqlx.DB, ob *outbox.Outbox, payload []byte) {
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		b.Error(err)
		return
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", JSON: payload}); err != nil {
		tx.Rollback()
		b.Error(err)
		return
	}
	if err := tx.Commit(); err != nil {
		b.Error(err)
	}
}

// BenchmarkDrain measures the poller alone draining a backlog of b.N
// committed events (hot path off, as after a crash or an outage).
func BenchmarkDrain(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql"} {
		for _, batch := range []int{outbox.DefaultPollBatchSize, 1000} {
			b.Run(fmt.Sprintf("%s/batch=%d", name, batch), func(b *testing.B) { benchDrain(b, name, batch) })
		}
	}
}

func benchDrain(b *testing.B, name string, batch int) {
	db := testdb.Open(b, name)
	st := testdb.Store(b, db)
	ctx := context.Background()
	producer, _ := outbox.New(st, outbox.Config{DisableHotPath: true})
	for left := b.N; left > 0; {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			b.Fatal(err)
		}
		for k := min(left, 1000); k > 0; k-- {
			if _, err := producer.PublishTx(ctx, tx, outbox.Envelope{Type: "E", JSON: []byte(`{"n":1}`)}); err != nil {
				b.Fatal(err)
			}
			left--
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	}
	ob, err := outbox.New(st, outbox.Config{SkipRecent: -1, PollBatchSize: batch, ColdQueueSize: max(outbox.DefaultColdQueueSize, 2*batch)})
	if err != nil {
		b.Fatal(err)
	}
	waitAll := countDeliveries(ob, b.N)
	b.ResetTimer()
	ob.Start(ctx)
	waitAll(b, 5*time.Minute)
	ob.Close(ctx)
	producer.Close(ctx)
}

// BenchmarkPublishTen measures a transaction that publishes ten events,
// one Publish at a time or in one PublishAll; one op is one transaction
// (hot path off: only the writes are measured).
func BenchmarkPublishTen(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql", "postgres"} {
		for _, all := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/PublishAll=%v", name, all), func(b *testing.B) {
				db := testdb.Open(b, name)
				ob, err := outbox.New(testdb.Store(b, db), outbox.Config{DisableHotPath: true})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				envs := make([]outbox.Envelope, 10)
				for i := range envs {
					envs[i] = outbox.Envelope{Type: "OrderLine", JSON: []byte(`{"sku":"book","qty":2,"price_cents":1250}`)}
				}
				b.ResetTimer()
				for range b.N {
					tx, err := outbox.BeginTx(ctx, db.DB, nil)
					if err != nil {
						b.Fatal(err)
					}
					if all {
						_, err = ob.PublishAllTx(ctx, tx, envs...)
					} else {
						for _, env := range envs {
							if _, err = ob.PublishTx(ctx, tx, env); err != nil {
								break
							}
						}
					}
					if err != nil {
						tx.Rollback()
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSubscriptionDrain drains a backlog of b.N events through one
// subscription whose destination takes 1 ms per call: per event (4
// workers: about 4k events/s at best) or in batches of 500 (bounded by the
// database's claims and completions).
func BenchmarkSubscriptionDrain(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql", "postgres"} {
		for _, batch := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/batch=%v", name, batch), func(b *testing.B) {
				db := testdb.Open(b, name)
				st := testdb.Store(b, db)
				ctx := context.Background()
				producer, _ := outbox.New(st, outbox.Config{DisableHotPath: true})
				for left := b.N; left > 0; {
					tx, err := outbox.BeginTx(ctx, db.DB, nil)
					if err != nil {
						b.Fatal(err)
					}
					envs := make([]outbox.Envelope, min(left, 1000))
					for i := range envs {
						envs[i] = outbox.Envelope{Type: "E", JSON: []byte(`{"n":1}`)}
					}
					if _, err := producer.PublishAllTx(ctx, tx, envs...); err != nil {
						b.Fatal(err)
					}
					left -= len(envs)
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				ob, err := outbox.New(st, outbox.Config{SkipRecent: -1, PollBatchSize: 1000, ColdQueueSize: 4000})
				if err != nil {
					b.Fatal(err)
				}
				c := newDrainCount(b.N)
				sub := outbox.Subscription{Name: "destination"}
				if batch {
					sub.BatchSize, sub.Concurrency = 500, 4
					sub.Batch = func(_ context.Context, evs []outbox.Event) error {
						time.Sleep(time.Millisecond)
						c.add(len(evs))
						return nil
					}
				} else {
					sub.Handler = func(context.Context, outbox.Event) error {
						time.Sleep(time.Millisecond)
						c.add(1)
						return nil
					}
				}
				if err := ob.Subscribe(sub); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				ob.Start(ctx)
				c.wait(b, 5*time.Minute)
				ob.Close(ctx)
				producer.Close(ctx)
			})
		}
	}
}

// BenchmarkOrderedBacklogDrain drains a backlog of b.N events of an
// ordered subscription over 1 key (every event behind the one before it)
// or 100, published while the subscription was paused (a destination's
// outage leaves the same backlog), then resumed: the key's events go out
// in runs behind each claimed head (BENCHMARKS.md, items 19 and 20). It
// reports events/s and the claims of heads that leased events.
//
//	go test -run '^$' -bench OrderedBacklogDrain -benchtime 20000x ./outbox/sqlstore
func BenchmarkOrderedBacklogDrain(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql", "postgres"} {
		for _, keys := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/keys=%d", name, keys), func(b *testing.B) {
				db := testdb.Open(b, name)
				st := testdb.Store(b, db)
				ctx := context.Background()
				c := newDrainCount(b.N)
				m := &takeCount{}
				ob := startOrdered(b, st, outbox.Config{Metrics: m}, outbox.Subscription{Name: "o", Order: outbox.Ordered,
					Handler: func(context.Context, outbox.Event) error {
						c.add(1)
						return nil
					}})
				if err := ob.Pause(ctx, "o"); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < b.N; {
					tx, err := outbox.BeginTx(ctx, db.DB, nil)
					if err != nil {
						b.Fatal(err)
					}
					for end := min(i+500, b.N); i < end; i++ {
						env := outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: fmt.Sprint(i % keys), JSON: []byte(`{}`)}
						if _, err := ob.PublishTx(ctx, tx, env); err != nil {
							b.Fatal(err)
						}
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				}
				before := m.took.Load()
				b.ResetTimer()
				if err := ob.Resume(ctx, "o"); err != nil {
					b.Fatal(err)
				}
				c.wait(b, 5*time.Minute)
				b.ReportMetric(float64(m.took.Load()-before), "claims")
			})
		}
	}
}

// BenchmarkOrderedBesideUnorderedDrain drains a backlog of b.N events over
// 100 keys on 3 instances, to two subscriptions of the same events, each
// with a handler that takes 5 ms (a destination's round trip): one
// Ordered, one Unordered. The subscriptions were registered (and their
// instances stopped) before the backlog was published, as after an outage
// of the consumers; the 3 instances start together and the timer runs
// until each subscription has had every event once. It reports each
// subscription's events/s and ordered÷unordered (issue 34's row: at least
// 0.5 on each database).
//
//	go test -run '^$' -bench OrderedBesideUnorderedDrain -benchtime 10000x ./outbox/sqlstore
func BenchmarkOrderedBesideUnorderedDrain(b *testing.B) {
	for _, name := range []string{"sqlite", "mysql", "postgres"} {
		b.Run(name, func(b *testing.B) {
			db := testdb.Open(b, name)
			st := testdb.Store(b, db)
			ctx := context.Background()
			ord, unord := newFirstCount(b.N), newFirstCount(b.N)
			subs := []outbox.Subscription{
				{Name: "o", Order: outbox.Ordered, Handler: ord.handler(5 * time.Millisecond)},
				{Name: "u", Handler: unord.handler(5 * time.Millisecond)},
			}
			// Register the subscriptions, then stop: the backlog is owed to them.
			startOrdered(b, st, outbox.Config{InstanceID: "register"}, subs...).Close(ctx)
			producer := startOrdered(b, st, outbox.Config{InstanceID: "producer"})
			for i := 0; i < b.N; {
				tx, err := outbox.BeginTx(ctx, db.DB, nil)
				if err != nil {
					b.Fatal(err)
				}
				for end := min(i+500, b.N); i < end; i++ {
					env := outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: fmt.Sprint(i % 100), JSON: []byte(`{}`)}
					if _, err := producer.PublishTx(ctx, tx, env); err != nil {
						b.Fatal(err)
					}
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			start := time.Now()
			for k := range 3 {
				startOrdered(b, st, outbox.Config{InstanceID: fmt.Sprintf("drain-%d", k)}, subs...)
			}
			to, tu := ord.wait(b, start, 10*time.Minute), unord.wait(b, start, 10*time.Minute)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/to.Seconds(), "ordered_events/s")
			b.ReportMetric(float64(b.N)/tu.Seconds(), "unordered_events/s")
			b.ReportMetric(tu.Seconds()/to.Seconds(), "ordered/unordered")
		})
	}
}

// firstCount counts the events a subscription had at least once.
type firstCount struct {
	n    int64
	seen sync.Map
	got  atomic.Int64
	at   time.Time     // when the n-th distinct event came; written before all is closed
	all  chan struct{} // closed at the n-th distinct event
}

func newFirstCount(n int) *firstCount { return &firstCount{n: int64(n), all: make(chan struct{})} }

func (c *firstCount) handler(took time.Duration) outbox.Handler {
	return func(ctx context.Context, ev outbox.Event) error {
		time.Sleep(took)
		if _, dup := c.seen.LoadOrStore(ev.ID, true); !dup && c.got.Add(1) == c.n {
			c.at = time.Now()
			close(c.all)
		}
		return nil
	}
}

// wait returns how long after start the n-th distinct event came.
func (c *firstCount) wait(b *testing.B, start time.Time, timeout time.Duration) time.Duration {
	select {
	case <-c.all:
		return c.at.Sub(start)
	case <-time.After(timeout):
		b.Fatalf("had %d of %d events", c.got.Load(), c.n)
		return 0
	}
}

// claimCount counts the claims of heads, whether they took anything.
type claimCount struct {
	outbox.NopMetrics
	heads atomic.Int64
}

func (m *claimCount) Statement(name string, _ int, _ time.Duration) {
	if name == "claim_heads" {
		m.heads.Add(1)
	}
}

// BenchmarkOrderedOutage is the row of the sequencer's quiet keys
// (docs/design/ordering.md): an Ordered subscription's destination is down
// for 5 s while 8 producers publish one event a transaction over 100 keys.
// Each key's head fails and waits for its retry (1 s); every event
// published behind it names the key at commit. It reports the claims of
// heads made during the outage (a claim of a key whose head waits for its
// retry takes nothing) and the producers' events/s. b.N is not used: run
// it with -benchtime 1x.
//
//	go test -run '^$' -bench OrderedOutage -benchtime 1x ./outbox/sqlstore
func BenchmarkOrderedOutage(b *testing.B) {
	const producers, keys, outage = 8, 100, 5 * time.Second
	for _, name := range []string{"mysql", "postgres"} {
		b.Run(name, func(b *testing.B) {
			db := testdb.Open(b, name)
			st := testdb.Store(b, db)
			ctx := context.Background()
			m := &claimCount{}
			var down atomic.Bool
			down.Store(true)
			ob := startOrdered(b, st, outbox.Config{Metrics: m}, outbox.Subscription{Name: "o", Order: outbox.Ordered,
				Retry: outbox.RetryFunc(func(int) time.Duration { return time.Second }),
				Handler: func(context.Context, outbox.Event) error {
					if down.Load() {
						return errors.New("destination down")
					}
					return nil
				}})
			b.ResetTimer()
			before := m.heads.Load()
			end := time.Now().Add(outage)
			var published atomic.Int64
			var wg sync.WaitGroup
			for p := range producers {
				wg.Go(func() {
					for i := p; time.Now().Before(end); i += producers {
						tx, err := outbox.BeginTx(ctx, db.DB, nil)
						if err != nil {
							b.Error(err)
							return
						}
						env := outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: fmt.Sprint(i % keys), JSON: []byte(`{}`)}
						if _, err := ob.PublishTx(ctx, tx, env); err != nil {
							tx.Rollback()
							b.Error(err)
							return
						}
						if err := tx.Commit(); err != nil {
							b.Error(err)
							return
						}
						published.Add(1)
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(m.heads.Load()-before), "claims")
			b.ReportMetric(float64(published.Load())/outage.Seconds(), "published/s")
			down.Store(false)
		})
	}
}
