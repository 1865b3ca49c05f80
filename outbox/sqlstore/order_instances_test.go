package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
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

// Three instances share the table, as during a rolling deploy that adds a
// subscription: all run the Ordered subscription "b" (which fails the
// first two attempts of some events) and the Unordered "c" (which fails
// the first attempt of others); only i0, the new version, also runs the
// Ordered "a", which takes every type and fails first attempts of yet
// other events. Sixteen producers publish the events of 12 keys, each
// through an instance chosen at random, a key's events numbered under a
// mutex held across the transaction (what an application's lock on the
// aggregate does): a key's consecutive events often go through different
// instances, the one before still in flight elsewhere. Every subscription
// gets every event; each Ordered one gets a key's events in their order,
// never tries one before the one before it succeeded, and never holds two
// of a key in its handler at once, across the instances.
func TestOrderedSubscriptionsAcrossInstances(t *testing.T) {
	const (
		instances = 3
		producers = 16
		keys      = 12
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			events := 360
			if name == "sqlite" {
				events = 120 // one writer: the producers take turns
			}
			st := testdb.Store(t, testdb.Open(t, name))
			pub := newNumbered(keys)
			retry := outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond })
			ordered := func(sub string) (*keyLog, outbox.Subscription) {
				l := newKeyLog(t, events)
				l.fail = func(ev outbox.Event) error {
					i, ok := pub.number(ev.ID)
					l.mu.Lock()
					before := len(l.got[ev.Key()])
					l.mu.Unlock()
					if !ok || before != i {
						t.Errorf("%s: event %s, number %d of key %s (published: %v), attempted (attempt %d, %s) with %d of the key delivered before it; the key: %s",
							sub, ev.ID, i, ev.Key(), ok, ev.Attempt, ev.Path, before, pub.describe(st, ev.Key(), i))
					}
					if injectedFailure(sub, ev.ID, ev.Attempt) {
						return errors.New("injected failure")
					}
					return nil
				}
				return l, outbox.Subscription{Name: sub, Order: outbox.Ordered, Handler: l.handle, Retry: retry}
			}
			a, subA := ordered("a")
			b, subB := ordered("b")
			var cmu sync.Mutex
			gotC := map[string]bool{}
			doneC := make(chan struct{})
			subC := outbox.Subscription{Name: "c", Order: outbox.Unordered, Retry: retry,
				Handler: func(ctx context.Context, ev outbox.Event) error {
					if injectedFailure("c", ev.ID, ev.Attempt) {
						return errors.New("injected failure")
					}
					cmu.Lock()
					defer cmu.Unlock()
					if !gotC[ev.ID] {
						gotC[ev.ID] = true
						if len(gotC) == events {
							close(doneC)
						}
					}
					return nil
				}}
			var obs []*outbox.Outbox
			for i := range instances {
				subs := []outbox.Subscription{subB, subC}
				if i == 0 {
					subs = append(subs, subA)
				}
				obs = append(obs, startOrdered(t, st, instance(i), subs...))
			}

			pub.produce(t, st.DB().DB, obs, producers, events, 1)
			a.wait(t, 60*time.Second)
			b.wait(t, 60*time.Second)
			select {
			case <-doneC:
			case <-time.After(60 * time.Second):
				cmu.Lock()
				defer cmu.Unlock()
				t.Fatalf("c (unordered) got %d of %d events", len(gotC), events)
			}
			for k := range keys {
				want := pub.ids(k)
				a.wantKey(t, numberedKey(k), want)
				b.wantKey(t, numberedKey(k), want)
			}
		})
	}
}

// injectedFailure reports whether attempt of event id fails on purpose for
// subscription sub: "a" fails one first attempt in 7, "b" the first two of
// one event in 5, others the first of one in 10.
func fnvOf(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

func injectedFailure(sub, id string, attempt int) bool {
	v := fnvOf(sub + id)
	switch sub {
	case "a":
		return attempt == 1 && v%7 == 0
	case "b":
		return attempt <= 2 && v%5 == 0
	}
	return attempt == 1 && v%10 == 0
}

func numberedKey(k int) string { return "Acct:" + strconv.Itoa(k) }

// instance is the Config of the instance numbered i in the tests that run
// several: InstanceID "i<i>", a short poll.
func instance(i int) outbox.Config {
	return outbox.Config{InstanceID: "i" + strconv.Itoa(i), PollInterval: 50 * time.Millisecond}
}

// numbered publishes the events of keys Acct:0, Acct:1, … in a known order
// per key: a key's events are numbered, and published, under the key's
// mutex held across the transaction.
type numbered struct {
	keys  []sync.Mutex
	mu    sync.Mutex // guards the rest
	order [][]string // per key, its events' ids by number
	num   map[string]int
	where map[string]string // id → instance it was published on
}

func newNumbered(keys int) *numbered {
	return &numbered{keys: make([]sync.Mutex, keys), order: make([][]string, keys), num: map[string]int{}, where: map[string]string{}}
}

// publish publishes the next event of key k through ob (instance name) in
// a transaction of its own. The event is numbered before the commit (it
// may be delivered before Commit returns), and the number taken back if
// the transaction fails. A MySQL deadlock is retried, as an application
// would.
func (p *numbered) publish(ctx context.Context, db *sql.DB, ob *outbox.Outbox, name string, k int) error {
	p.keys[k].Lock()
	defer p.keys[k].Unlock()
	for attempt := 1; ; attempt++ {
		env := outbox.Envelope{ID: outbox.NewID(), Type: "Posted", AggregateType: "Acct", AggregateID: strconv.Itoa(k), JSON: []byte(`{}`)}
		p.mu.Lock()
		p.num[env.ID], p.where[env.ID] = len(p.order[k]), name
		p.order[k] = append(p.order[k], env.ID)
		p.mu.Unlock()
		_, err := publishWithin(ctx, db, ob, env)
		if err == nil {
			return nil
		}
		p.forget(k, env.ID)
		if !strings.Contains(err.Error(), "Error 1213") || attempt == 10 {
			return fmt.Errorf("publish an event of key %d on %s: %w", k, name, err)
		}
	}
}

// forget takes back id, the last event numbered in key k, whose
// transaction failed.
func (p *numbered) forget(k int, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.order[k] = p.order[k][:len(p.order[k])-1]
	delete(p.num, id)
	delete(p.where, id)
}

// produce publishes events events from producers goroutines, each event
// of a key chosen at random through an instance of obs chosen at random
// (seed seeds the choices), and returns when all are committed.
func (p *numbered) produce(t *testing.T, db *sql.DB, obs []*outbox.Outbox, producers, events int, seed uint64) {
	t.Helper()
	var mu sync.Mutex
	left := events
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		left--
		return left >= 0
	}
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for g := range producers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), seed))
			for take() {
				i := rnd.IntN(len(obs))
				if err := p.publish(context.Background(), db, obs[i], "i"+strconv.Itoa(i), rnd.IntN(len(p.keys))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// number returns event id's number in its key, from 0.
func (p *numbered) number(id string) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.num[id]
	return n, ok
}

// ids returns key k's events by number.
func (p *numbered) ids(k int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order[k]...)
}

// describe returns the stored state of key's events up to number n, for a
// failure message.
func (p *numbered) describe(st *sqlstore.Store, key string, n int) string {
	k, _ := strconv.Atoi(strings.TrimPrefix(key, "Acct:"))
	ids := p.ids(k)
	var sb strings.Builder
	for i, id := range ids[:min(len(ids), n+1)] {
		p.mu.Lock()
		where := p.where[id]
		p.mu.Unlock()
		rec, err := st.Inspect(context.Background(), id)
		if err != nil {
			fmt.Fprintf(&sb, "\n  #%d %s (published on %s): %v", i, id, where, err)
			continue
		}
		fmt.Fprintf(&sb, "\n  #%d %s (published on %s): %v, number %d, held by %q", i, id, where, rec.Status, rec.KeySeq, rec.Owner)
		for _, d := range rec.Deliveries {
			fmt.Fprintf(&sb, "; %s %v after %d attempts, held by %q", d.Subscription, d.Status, d.Attempts, d.Owner)
		}
	}
	return sb.String()
}

// Across instances, an event dead for an Ordered subscription blocks its
// key, and only its key, for that subscription until an operator replays
// it; then the key's events go out in their order. Three instances, 16
// producers, 12 keys; about one event in 13 fails until the replay (two
// attempts, then dead), others fail once.
func TestOrderedDeadBlocksAcrossInstancesUntilReplayed(t *testing.T) {
	const (
		instances = 3
		producers = 16
		keys      = 12
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			events := 240
			if name == "sqlite" {
				events = 120
			}
			st := testdb.Store(t, testdb.Open(t, name))
			pub := newNumbered(keys)
			poisoned := func(id string) bool { return fnvOf("poison"+id)%13 == 0 }
			var mu sync.Mutex
			broken := true
			dead := map[string]bool{} // events whose last attempt failed
			l := newKeyLog(t, events)
			l.fail = func(ev outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case broken && poisoned(ev.ID):
					if ev.Attempt == 2 {
						dead[ev.ID] = true
					}
					return errors.New("poison")
				case ev.Attempt == 1 && injectedFailure("b", ev.ID, 1):
					return errors.New("injected failure")
				}
				return nil
			}
			sub := outbox.Subscription{Name: "b", Order: outbox.Ordered, Handler: l.handle, MaxAttempts: 2,
				Retry: outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond })}
			var obs []*outbox.Outbox
			for i := range instances {
				obs = append(obs, startOrdered(t, st, instance(i), sub))
			}
			pub.produce(t, st.DB().DB, obs, producers, events, 3)
			// Each key is delivered up to its first poisoned event, which
			// goes dead; the rest of the key waits.
			prefix := map[string][]string{}
			var blocked []string
			for k := range keys {
				ids := pub.ids(k)
				n := slices.IndexFunc(ids, poisoned)
				if n < 0 {
					n = len(ids)
				} else {
					blocked = append(blocked, ids[n])
				}
				prefix[numberedKey(k)] = ids[:n]
			}
			waitUntil(t, 60*time.Second, "every key delivered up to its first poisoned event, which is dead", func() bool {
				l.mu.Lock()
				defer l.mu.Unlock()
				for k, want := range prefix {
					if len(l.got[k]) < len(want) {
						return false
					}
				}
				mu.Lock()
				defer mu.Unlock()
				return len(dead) == len(blocked)
			})
			// The handler's last failure comes before the engine writes the
			// event DEAD: the keys show as blocked once that write is in.
			var bk []outbox.BlockedKey
			waitUntil(t, 10*time.Second, fmt.Sprintf("BlockedKeys lists the %d keys of the dead events", len(blocked)), func() bool {
				var err error
				if bk, err = obs[2].BlockedKeys(context.Background(), "", 100); err != nil {
					t.Fatal(err)
				}
				return len(bk) >= len(blocked)
			})
			if len(bk) != len(blocked) {
				t.Errorf("BlockedKeys: %d keys; want %d", len(bk), len(blocked))
			}
			for k, want := range prefix {
				l.wantKey(t, k, want)
			}
			mu.Lock()
			for _, id := range blocked {
				if !dead[id] {
					t.Errorf("event %s, the first poisoned of its key, did not go dead", id)
				}
			}
			broken = false
			mu.Unlock()
			if n, err := obs[1].Replay(context.Background(), outbox.DeadFilter{Subscription: "b"}, false); err != nil || n != len(blocked) {
				t.Fatalf("Replay = %d, %v; want %d", n, err, len(blocked))
			}
			l.wait(t, 60*time.Second)
			for k := range keys {
				l.wantKey(t, numberedKey(k), pub.ids(k))
			}
		})
	}
}

// waitUntil polls ok until it holds, failing the test after d.
func waitUntil(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached in %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Three instances share a backlog of many keys for an Ordered
// subscription: each claims the heads of at most 2 × Workers keys at a
// time, and another key as one of those ends, so that every instance
// delivers part of it (at least one key's events). Before that bound the first instance to sweep
// took every key, with the runs behind their heads, and the others,
// finding every head in its hands, delivered nothing.
func TestInstancesShareAnOrderedBacklog(t *testing.T) {
	const (
		keys   = 40
		perKey = 10
		events = keys * perKey
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			log := newKeyLog(t, events)
			var took [3]atomic.Int64
			sub := func(i int) outbox.Subscription {
				return outbox.Subscription{Name: "o", Order: outbox.Ordered, Handler: func(ctx context.Context, ev outbox.Event) error {
					time.Sleep(5 * time.Millisecond) // a destination's round trip
					took[i].Add(1)
					return log.handle(ctx, ev)
				}}
			}
			// Registered, then stopped: the backlog is owed to it.
			startOrdered(t, st, outbox.Config{InstanceID: "register"}, sub(0)).Close(ctx)
			producer := startOrdered(t, st, outbox.Config{InstanceID: "producer"})
			published := map[string][]string{}
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range events {
				env := outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: strconv.Itoa(i % keys), JSON: []byte(`{}`)}
				id, err := producer.PublishTx(ctx, tx, env)
				if err != nil {
					t.Fatal(err)
				}
				published[env.Key()] = append(published[env.Key()], id)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			for i := range took {
				cfg := instance(i)
				cfg.Workers = 2
				startOrdered(t, st, cfg, sub(i))
			}
			log.wait(t, 60*time.Second)
			for k, ids := range published {
				log.wantKey(t, k, ids)
			}
			t.Logf("delivered by i0, i1, i2: %d, %d, %d", took[0].Load(), took[1].Load(), took[2].Load())
			// At least a key's events each: the instances start one after
			// another, and the first drains alone meanwhile. On SQLite
			// every claim and completion takes the one write lock, and
			// under CPU load one instance can lose it throughout the
			// drain (0 events in 1 to 3 runs of 12 beside two busy loops,
			// on ee6c3d2's SQLite path too): there two of the three must take part.
			// Either way the defect this guards, the first sweep leasing
			// every key (400, 0, 0), fails.
			want := len(took)
			if name == "sqlite" {
				want = 2
			}
			part := 0
			for i := range took {
				if took[i].Load() >= perKey {
					part++
				}
			}
			if part < want {
				t.Errorf("%d of 3 instances delivered at least %d of the %d events (each: %d, %d, %d); want %d to take part", part, perKey, events, took[0].Load(), took[1].Load(), took[2].Load(), want)
			}
		})
	}
}
