package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// rollingPool is a set of instance slots that producers publish through,
// one of which a rolling deploy replaces now and then: the old instance
// is taken out of the pool, its publishing transactions finish, it is
// closed, and a new one (a new InstanceID) takes its slot.
type rollingPool struct {
	t     *testing.T
	st    *sqlstore.Store
	subs  []outbox.Subscription
	mu    sync.RWMutex // guards obs and gens
	obs   []*outbox.Outbox
	gens  []int
	inUse []sync.RWMutex // per slot: held (read) across a transaction
}

func newRollingPool(t *testing.T, st *sqlstore.Store, n int, subs ...outbox.Subscription) *rollingPool {
	p := &rollingPool{t: t, st: st, subs: subs, obs: make([]*outbox.Outbox, n), gens: make([]int, n), inUse: make([]sync.RWMutex, n)}
	for i := range n {
		p.obs[i] = p.start(i, 0)
	}
	return p
}

func (p *rollingPool) start(slot, gen int) *outbox.Outbox {
	cfg := instance(slot)
	cfg.InstanceID += "g" + strconv.Itoa(gen)
	// A claim that fails is retried by the next poll, which would hide a
	// broken statement: the engine's errors fail the test.
	cfg.Logger = slog.New(errorsFail{p.t})
	return startOrdered(p.t, p.st, cfg, p.subs...)
}

// errorsFail is a slog.Handler that fails t on every record at level
// ERROR and drops the rest.
type errorsFail struct{ t *testing.T }

func (h errorsFail) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (h errorsFail) Handle(_ context.Context, r slog.Record) error {
	var sb strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&sb, " %s=%v", a.Key, a.Value)
		return true
	})
	h.t.Errorf("engine error: %s%s", r.Message, sb.String())
	return nil
}
func (h errorsFail) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h errorsFail) WithGroup(string) slog.Handler      { return h }

// take returns slot's instance, held until release.
func (p *rollingPool) take(slot int) *outbox.Outbox {
	p.inUse[slot].RLock()
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.obs[slot]
}

func (p *rollingPool) release(slot int) { p.inUse[slot].RUnlock() }

// replace closes slot's instance once no transaction uses it, and starts
// the next generation in its place.
func (p *rollingPool) replace(slot int) error {
	p.inUse[slot].Lock()
	defer p.inUse[slot].Unlock()
	p.mu.Lock()
	old := p.obs[slot]
	p.gens[slot]++
	gen := p.gens[slot]
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := old.Close(ctx); err != nil {
		return fmt.Errorf("close slot %d: %w", slot, err)
	}
	ob := p.start(slot, gen)
	p.mu.Lock()
	p.obs[slot] = ob
	p.mu.Unlock()
	return nil
}

// chaosLedger records what the producers committed: per key, its events'
// ids in commit order.
type chaosLedger struct {
	keys   []sync.Mutex
	mu     sync.Mutex
	order  [][]string
	rolled map[string]bool // ids of events whose transaction rolled back
	count  int
}

func newChaosLedger(keys int) *chaosLedger {
	return &chaosLedger{keys: make([]sync.Mutex, keys), order: make([][]string, keys), rolled: map[string]bool{}}
}

// tx runs one transaction through ob publishing n events spread over
// keys ks (locked in order, held across the transaction, as an
// application's locks on its aggregates would be), and rolls it back if
// rollback is set. The events are numbered before the commit (they may be
// delivered before Commit returns) and taken back if it fails.
func (l *chaosLedger) tx(ctx context.Context, db *sql.DB, ob *outbox.Outbox, ks []int, n int, rollback bool) error {
	slices.Sort(ks)
	ks = slices.Compact(ks)
	for _, k := range ks {
		l.keys[k].Lock()
		defer l.keys[k].Unlock()
	}
	for attempt := 1; ; attempt++ {
		tx, err := outbox.BeginTx(ctx, db, nil)
		if err != nil {
			return err
		}
		var ids []string
		var keyOf []int
		for i := range n {
			k := ks[i%len(ks)]
			env := outbox.Envelope{ID: outbox.NewID(), Type: "Posted", AggregateType: "Acct", AggregateID: strconv.Itoa(k), JSON: []byte(`{}`)}
			l.mu.Lock()
			l.order[k] = append(l.order[k], env.ID)
			l.mu.Unlock()
			ids, keyOf = append(ids, env.ID), append(keyOf, k)
			if _, err = ob.PublishTx(ctx, tx, env); err != nil {
				break
			}
		}
		if err == nil && rollback {
			err = tx.Rollback()
			l.takeBack(ids, keyOf, true)
			return err
		}
		if err == nil {
			err = tx.Commit()
		} else {
			tx.Rollback()
		}
		if err == nil {
			l.mu.Lock()
			l.count += n
			l.mu.Unlock()
			return nil
		}
		l.takeBack(ids, keyOf, false)
		if !strings.Contains(err.Error(), "Error 1213") || attempt == 10 {
			return fmt.Errorf("publish %d events of keys %v: %w", n, ks, err)
		}
	}
}

func (l *chaosLedger) takeBack(ids []string, keyOf []int, rolled bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(ids) - 1; i >= 0; i-- {
		k := keyOf[i]
		l.order[k] = l.order[k][:len(l.order[k])-1]
		if rolled {
			l.rolled[ids[i]] = true
		}
	}
}

func (l *chaosLedger) ids(k int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order[k])
}

// Ordered delivery in production's ordinary mess, on every database: three
// instances behind a load balancer, two of them replaced one after the
// other by a rolling deploy while the producers run; transactions that
// publish up to three events of one or two keys, one in eight rolled back
// after publishing; handler failures. Every committed event reaches both
// subscriptions once, the Ordered one in each key's commit order, one at a
// time; no rolled-back event reaches either.
func TestOrderedThroughARollingDeploy(t *testing.T) {
	const (
		slots     = 3
		producers = 16
		keys      = 24
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			txs := 1500
			if name == "sqlite" {
				txs = 100
			}
			st := testdb.Store(t, testdb.Open(t, name))
			led := newChaosLedger(keys)
			retry := outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond })

			var mu sync.Mutex
			got := map[string][]string{} // ordered: key → ids as delivered
			inflight := map[string]bool{}
			seen := map[string]int{} // unordered: id → deliveries
			var delivered, unordered atomic.Int64
			progress := make(chan struct{}, 1) // a delivery succeeded
			tick := func() {
				select {
				case progress <- struct{}{}:
				default:
				}
			}
			ordered := outbox.Subscription{Name: "a", Order: outbox.Ordered, Retry: retry,
				Handler: func(ctx context.Context, ev outbox.Event) error {
					k := ev.Key()
					mu.Lock()
					if inflight[k] {
						t.Errorf("two events of key %s in the handler at once (the second %s)", k, ev.ID)
					}
					inflight[k] = true
					mu.Unlock()
					var err error
					if injectedFailure("a", ev.ID, ev.Attempt) {
						err = errors.New("injected failure")
					}
					mu.Lock()
					defer mu.Unlock()
					inflight[k] = false
					if err == nil {
						got[k] = append(got[k], ev.ID)
						delivered.Add(1)
						tick()
					}
					return err
				}}
			plain := outbox.Subscription{Name: "u", Order: outbox.Unordered, Retry: retry,
				Handler: func(ctx context.Context, ev outbox.Event) error {
					if injectedFailure("u", ev.ID, ev.Attempt) {
						return errors.New("injected failure")
					}
					mu.Lock()
					defer mu.Unlock()
					seen[ev.ID]++
					unordered.Add(1)
					tick()
					return nil
				}}
			pool := newRollingPool(t, st, slots, ordered, plain)
			db := st.DB().DB

			var left atomic.Int64
			left.Store(int64(txs))
			// The deploy: slot 1 when a third of the transactions are
			// taken, slot 2 at two thirds.
			deploy := make(chan struct{}, 2)
			var wg sync.WaitGroup
			errs := make(chan error, producers+1)
			for g := range producers {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(g), 7))
					for {
						n := left.Add(-1)
						if n < 0 {
							return
						}
						if n == int64(txs-txs/3) || n == int64(txs-2*txs/3) {
							deploy <- struct{}{}
						}
						slot := rnd.IntN(slots)
						ks := []int{rnd.IntN(keys)}
						if rnd.IntN(10) == 0 {
							ks = append(ks, rnd.IntN(keys))
						}
						n1 := 1 + rnd.IntN(3)
						ob := pool.take(slot)
						err := led.tx(context.Background(), db, ob, ks, n1, rnd.IntN(8) == 0)
						pool.release(slot)
						if err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Go(func() {
				for _, slot := range []int{1, 2} {
					<-deploy
					if err := pool.replace(slot); err != nil {
						errs <- err
						return
					}
				}
			})
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			led.mu.Lock()
			want := int64(led.count)
			led.mu.Unlock()
			deadline := time.After(60 * time.Second)
			for delivered.Load() < want || unordered.Load() < want {
				select {
				case <-progress:
					continue
				case <-deadline:
				}
				mu.Lock()
				for k := range keys {
					w := led.ids(k)
					g := got[numberedKey(k)]
					if len(g) < len(w) {
						var sb strings.Builder
						for _, id := range w[len(g):min(len(w), len(g)+3)] {
							rec, err := st.Inspect(context.Background(), id)
							if err != nil {
								fmt.Fprintf(&sb, "\n   %s: %v", id, err)
								continue
							}
							fmt.Fprintf(&sb, "\n   %s (in got at %d): seq %d %v owner %q attempts %d", id, slices.Index(g, id), rec.KeySeq, rec.Status, rec.Owner, rec.Attempts)
							for _, d := range rec.Deliveries {
								fmt.Fprintf(&sb, "; %s %v attempts %d owner %q", d.Subscription, d.Status, d.Attempts, d.Owner)
							}
						}
						t.Logf("key %d: %d of %d delivered; next:%s", k, len(g), len(w), sb.String())
						logPendingOfKey(t, st, numberedKey(k))
					}
				}
				mu.Unlock()
				t.Fatalf("after 60s: ordered %d, unordered %d of %d committed events delivered", delivered.Load(), unordered.Load(), want)
			}
			mu.Lock()
			defer mu.Unlock()
			for k := range keys {
				w := led.ids(k)
				if g := got[numberedKey(k)]; !slices.Equal(g, w) {
					t.Errorf("key %d delivered as\n %v\npublished as\n %v", k, g, w)
				}
				for _, id := range w {
					if seen[id] != 1 {
						t.Errorf("unordered: event %s of key %d delivered %d times", id, k, seen[id])
					}
				}
			}
			for id := range led.rolled {
				if seen[id] > 0 {
					t.Errorf("rolled-back event %s delivered", id)
				}
			}
			t.Logf("%d transactions, %d events committed, %d rolled back", txs, want, len(led.rolled))
		})
	}
}

// logPendingOfKey logs, for a test that found key stalled, the key's
// events not DONE and their deliveries not DONE, each with its lease
// (owner and end, as stored) beside the time now: whether a live lease
// holds the key, and whose.
func logPendingOfKey(t *testing.T, st *sqlstore.Store, key string) {
	t.Helper()
	db := st.DB()
	now := time.Now().UTC()
	rows, err := db.Query(db.Rebind(`SELECT o.key_seq, o.status, COALESCE(o.locked_by, ''), o.locked_until, COALESCE(d.subscription, ''), d.status, COALESCE(d.locked_by, ''), d.locked_until
FROM `+st.Table()+` o LEFT JOIN `+st.DeliveriesTable()+` d ON d.event_id = o.id AND d.status <> 1
WHERE o.ordering_key = ? AND o.status <> 1 ORDER BY o.key_seq LIMIT 12`), key)
	if err != nil {
		t.Logf("pending of %s: %v", key, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var seq, status int64
		var owner, sub, dOwner string
		var until, dStatus, dUntil any
		if err := rows.Scan(&seq, &status, &owner, &until, &sub, &dStatus, &dOwner, &dUntil); err != nil {
			t.Logf("pending of %s: %v", key, err)
			return
		}
		t.Logf("   pending %s #%d: status %d lease %q until %v; delivery %q status %v lease %q until %v (now %v)", key, seq, status, owner, until, sub, dStatus, dOwner, dUntil, now)
	}
}
