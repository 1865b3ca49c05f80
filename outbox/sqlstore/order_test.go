package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// keyLog records what an ordered subscription received, key by key, and
// fails the test if two events of one key are ever in its handler at once.
type keyLog struct {
	t        testing.TB
	mu       sync.Mutex
	inflight map[string]bool
	got      map[string][]string // key → "id" per successful delivery
	fail     func(ev outbox.Event) error
	done     chan struct{}
	want     int
	n        int
}

func newKeyLog(t testing.TB, want int) *keyLog {
	return &keyLog{t: t, inflight: map[string]bool{}, got: map[string][]string{}, done: make(chan struct{}), want: want}
}

func (l *keyLog) handle(ctx context.Context, ev outbox.Event) error {
	k := ev.Key()
	l.mu.Lock()
	if l.inflight[k] {
		l.t.Errorf("two events of key %s in the handler at once (the second is %s)", k, ev.ID)
	}
	l.inflight[k] = true
	l.mu.Unlock()
	var err error
	if l.fail != nil {
		err = l.fail(ev)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[k] = false
	if err != nil {
		return err
	}
	l.got[k] = append(l.got[k], ev.ID)
	l.n++
	if l.n == l.want {
		close(l.done)
	}
	return nil
}

func (l *keyLog) wait(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(d):
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Fatalf("delivered %d of %d events in %v", l.n, l.want, d)
	}
}

// wantKey fails the test unless key's events were delivered as want.
func (l *keyLog) wantKey(t testing.TB, key string, want []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !slices.Equal(l.got[key], want) {
		t.Errorf("key %s delivered as %v, published as %v", key, l.got[key], want)
	}
}

// publishInTx publishes env in a transaction of its own.
func publishInTx(t testing.TB, ob *outbox.Outbox, st *sqlstore.Store, env outbox.Envelope) string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.PublishTx(ctx, tx, env)
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// startOrdered starts an outbox on st with cfg (logs discarded unless
// cfg.Logger is set) and the
// subscription sub (named "projection" if unnamed), closed when the test
// ends.
func startOrdered(t testing.TB, st *sqlstore.Store, cfg outbox.Config, subs ...outbox.Subscription) *outbox.Outbox {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ob, err := outbox.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range subs {
		if sub.Name == "" {
			sub.Name = "projection"
		}
		if err := ob.Subscribe(sub); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })
	return ob
}

// A failed event holds back the later events of its key, for the ordered
// subscription, and nothing else: key B is delivered while key A's first
// event waits for its retry, and A's events arrive in publish order after
// it. Two events of one key are never in the handler at once.
func TestOrderedSubscriptionHoldsBackOnlyTheFailedKey(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			log := newKeyLog(t, 6)
			var a1 string
			var failedOnce sync.Once
			log.fail = func(ev outbox.Event) error {
				if ev.ID != a1 {
					return nil
				}
				var err error
				failedOnce.Do(func() { err = errors.New("first attempt fails") })
				if err == nil {
					// The retry, 300 ms later: key B went on meanwhile.
					log.mu.Lock()
					if len(log.got["Order:B"]) == 0 {
						t.Errorf("A1 retried before any event of key B was delivered")
					}
					log.mu.Unlock()
				}
				return err
			}
			if err := ob.Subscribe(outbox.Subscription{Name: "projection", Order: outbox.Ordered, Handler: log.handle,
				Retry: outbox.RetryFunc(func(int) time.Duration { return 300 * time.Millisecond })}); err != nil {
				t.Fatal(err)
			}
			if err := ob.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer ob.Close(context.Background())
			a1 = outbox.NewID()
			var wantA, wantB []string
			wantA = append(wantA, publishInTx(t, ob, st, outbox.Envelope{ID: a1, Type: "Placed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}))
			for i := range 2 {
				wantA = append(wantA, publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: fmt.Appendf(nil, `{"i":%d}`, i)}))
			}
			for i := range 3 {
				wantB = append(wantB, publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "B", JSON: fmt.Appendf(nil, `{"i":%d}`, i)}))
			}
			log.wait(t, 20*time.Second)
			log.wantKey(t, "Order:A", wantA)
			log.wantKey(t, "Order:B", wantB)
		})
	}
}

// waitDead waits until the event's delivery to sub is dead.
func waitDead(t testing.TB, st *sqlstore.Store, id, sub string) {
	t.Helper()
	waitDelivery(t, st, id, sub, outbox.StatusDead)
}

// failWhile makes l fail event id while the returned flag is set (it
// starts set), and returns the flag.
func failWhile(l *keyLog, id *string, why string) *atomic.Bool {
	var broken atomic.Bool
	broken.Store(true)
	l.fail = func(ev outbox.Event) error {
		if ev.ID == *id && broken.Load() {
			return errors.New(why)
		}
		return nil
	}
	return &broken
}

// waitStatus waits until event id has status want as a whole.
func waitStatus(t testing.TB, st *sqlstore.Store, id string, want outbox.Status) {
	t.Helper()
	waitRecord(t, st, id, fmt.Sprintf("became %v", want), func(rec outbox.Record) bool { return rec.Status == want })
}

// waitDelivery waits until event id's delivery to sub has status want.
func waitDelivery(t testing.TB, st *sqlstore.Store, id, sub string, want outbox.Status) {
	t.Helper()
	waitRecord(t, st, id, fmt.Sprintf("became %v for %s", want, sub), func(rec outbox.Record) bool {
		return slices.ContainsFunc(rec.Deliveries, func(d outbox.DeliveryRecord) bool { return d.Subscription == sub && d.Status == want })
	})
}

// waitRecord waits, up to 20 s, until what Inspect says of event id
// satisfies ok.
func waitRecord(t testing.TB, st *sqlstore.Store, id, what string, ok func(outbox.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := st.Inspect(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(rec) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s never %s: %+v", id, what, rec)
		}
		time.Sleep(5 * time.Millisecond) // polling the table: there is no signal for a write that already happened
	}
}

// A dead event blocks its key under Ordered (listed by BlockedKeys; no
// poll takes the key's later events) until it is skipped or replayed, and
// then the rest of the key follows in order; under OrderedSkipDead the key
// goes on by itself. Other keys flow throughout.
func TestOrderedDeadEventBlocksItsKey(t *testing.T) {
	for _, name := range testdb.Names {
		for _, tc := range []struct {
			name   string
			order  outbox.Order
			unlock string // "skip", "replay", or "" (nothing to do)
		}{
			{"skip", outbox.Ordered, "skip"},
			{"replay", outbox.Ordered, "replay"},
			{"skip-dead", outbox.OrderedSkipDead, ""},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				db := testdb.Open(t, name)
				st := testdb.Store(t, db)
				ctx := context.Background()
				ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				var a1 string
				var broken atomic.Bool // A1 fails while set
				broken.Store(true)
				want := 3 // A2, A3, B1
				if tc.unlock == "replay" {
					want = 4 // and A1, after its replay
				}
				log := newKeyLog(t, want)
				log.fail = func(ev outbox.Event) error {
					if ev.ID == a1 && broken.Load() {
						return errors.New("poison")
					}
					return nil
				}
				if err := ob.Subscribe(outbox.Subscription{Name: "projection", Order: tc.order, Handler: log.handle, MaxAttempts: 1}); err != nil {
					t.Fatal(err)
				}
				if err := ob.Start(ctx); err != nil {
					t.Fatal(err)
				}
				defer ob.Close(ctx)
				a1 = outbox.NewID()
				env := func(agg string) outbox.Envelope {
					return outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: agg, JSON: []byte(`{}`)}
				}
				first := env("A")
				first.ID = a1
				wantA := []string{publishInTx(t, ob, st, first)}
				waitDead(t, st, a1, "projection")
				for range 2 {
					wantA = append(wantA, publishInTx(t, ob, st, env("A")))
				}
				b1 := publishInTx(t, ob, st, env("B"))

				if tc.order == outbox.Ordered {
					blocked, err := ob.BlockedKeys(ctx, "", 10)
					if err != nil {
						t.Fatal(err)
					}
					if len(blocked) != 1 || blocked[0].Key != "Order:A" || blocked[0].EventID != a1 || blocked[0].Waiting != 2 {
						t.Fatalf("BlockedKeys = %+v; want Order:A blocked by %s with 2 waiting", blocked, a1)
					}
					// B flows; a poll leaves A's later events whole: the
					// only subscription is behind on A (driver.OrderFilter.Every),
					// so nobody could go on past them.
					if _, err := ob.Poll(ctx); err != nil {
						t.Fatalf("Poll while A is blocked: %v", err)
					}
					for _, id := range wantA[1:] {
						if rec, err := ob.Inspect(ctx, id); err != nil || rec.Status != outbox.StatusNew || len(rec.Deliveries) != 0 {
							t.Fatalf("event %s of the blocked key after a poll: %+v, %v; want it whole and NEW", id, rec, err)
						}
					}
					if blocked, err := ob.BlockedKeys(ctx, "", 10); err != nil || len(blocked) != 1 || blocked[0].Subscription != "projection" {
						t.Fatalf("BlockedKeys = %+v, %v; want Order:A blocked for projection", blocked, err)
					}
					if lags, err := ob.Lag(ctx); err != nil || len(lags) != 1 || lags[0].BlockedKeys != 1 {
						t.Fatalf("Lag = %+v, %v; want projection with 1 blocked key", lags, err)
					}
					log.mu.Lock()
					gotA := len(log.got["Order:A"])
					log.mu.Unlock()
					if gotA != 0 {
						t.Fatalf("key A delivered %d events past its dead head", gotA)
					}
					broken.Store(false)
					switch tc.unlock {
					case "skip":
						if n, err := ob.SkipDead(ctx, a1); err != nil || n != 1 {
							t.Fatalf("SkipDead = %d, %v; want 1", n, err)
						}
						wantA = wantA[1:]
					case "replay":
						if n, err := ob.Replay(ctx, outbox.DeadFilter{IDs: []string{a1}}, false); err != nil || n != 1 {
							t.Fatalf("Replay = %d, %v; want 1", n, err)
						}
					}
					if _, err := ob.Poll(ctx); err != nil {
						t.Fatal(err)
					}
				} else {
					wantA = wantA[1:]
				}
				log.wait(t, 20*time.Second)
				log.mu.Lock()
				defer log.mu.Unlock()
				if !slices.Equal(log.got["Order:A"], wantA) {
					t.Errorf("key A delivered as %v; want %v", log.got["Order:A"], wantA)
				}
				if !slices.Equal(log.got["Order:B"], []string{b1}) {
					t.Errorf("key B delivered as %v; want [%s]", log.got["Order:B"], b1)
				}
				if tc.order == outbox.Ordered {
					if blocked, err := ob.BlockedKeys(ctx, "", 10); err != nil || len(blocked) != 0 {
						t.Errorf("BlockedKeys after the unblock = %+v, %v; want none", blocked, err)
					}
				}
			})
		}
	}
}

// Head-of-line is per key and subscription: while an event keeps failing
// for one ordered subscription, the key's later events reach another
// ordered subscription at once, and wait for the failing one (their
// deliveries to it NEW, never attempted); once it recovers it receives
// them all, in order.
func TestOrderedFailureHoldsOnlyItsSubscription(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ctx := context.Background()
			a1 := outbox.NewID()
			proj, audit := newKeyLog(t, 3), newKeyLog(t, 3)
			broken := failWhile(proj, &a1, "projection store down")
			retry := outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond })
			ob := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond},
				outbox.Subscription{Name: "proj", Order: outbox.Ordered, Handler: proj.handle, Retry: retry, MaxAttempts: 1000},
				outbox.Subscription{Name: "audit", Order: outbox.Ordered, Handler: audit.handle, Retry: retry})
			env := outbox.Envelope{ID: a1, Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}
			want := []string{publishInTx(t, ob, st, env)}
			waitDelivery(t, st, a1, "proj", outbox.StatusRetry)
			for range 2 {
				env.ID = ""
				want = append(want, publishInTx(t, ob, st, env))
			}
			audit.wait(t, 20*time.Second)
			audit.wantKey(t, "Order:A", want)
			for _, id := range want[1:] {
				waitDelivery(t, st, id, "proj", outbox.StatusNew)
				rec, err := st.Inspect(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range rec.Deliveries {
					if d.Subscription == "proj" && d.Attempts != 0 {
						t.Errorf("%s was attempted %d times for proj while proj was behind on A1", id, d.Attempts)
					}
				}
			}
			proj.mu.Lock()
			early := slices.Clone(proj.got["Order:A"])
			proj.mu.Unlock()
			if len(early) != 0 {
				t.Fatalf("proj delivered %v while A1 kept failing for it", early)
			}
			broken.Store(false)
			proj.wait(t, 20*time.Second)
			proj.wantKey(t, "Order:A", want)
		})
	}
}

// An event that only other subscriptions take, delivered while an
// ordered subscription still owes an earlier event of its key, must not
// record the key as delivered up to it: the key's next event would be
// taken for the head and reach the subscription on the hot path before
// the event it owes.
func TestEventOthersTakeDoesNotOpenTheKeyForOneBehind(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			e0 := outbox.NewID()
			shipping, projection := newKeyLog(t, 2), newKeyLog(t, 3)
			broken := failWhile(shipping, &e0, "carrier down")
			// Retries and polls 100 ms apart: closer, the engine writes
			// almost without pause, and on SQLite, whose busy handler is not
			// fair, the test's own transactions could lose every try for
			// the 5 s busy timeout on a loaded machine.
			retry := outbox.RetryFunc(func(int) time.Duration { return 100 * time.Millisecond })
			ob := startOrdered(t, st, outbox.Config{PollInterval: 100 * time.Millisecond},
				outbox.Subscription{Name: "shipping", Order: outbox.Ordered, Handler: shipping.handle, Retry: retry, MaxAttempts: 1000, Types: []outbox.EventType{"Placed"}},
				outbox.Subscription{Name: "projection", Order: outbox.Ordered, Handler: projection.handle, Retry: retry})
			env := func(id string, typ outbox.EventType) outbox.Envelope {
				return outbox.Envelope{ID: id, Type: typ, AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}
			}
			publishInTx(t, ob, st, env(e0, "Placed"))
			waitDelivery(t, st, e0, "shipping", outbox.StatusRetry)
			e1 := publishInTx(t, ob, st, env("", "Noted")) // projection's only
			waitStatus(t, st, e1, outbox.StatusDone)
			e2 := publishInTx(t, ob, st, env("", "Placed"))
			projection.wait(t, 20*time.Second)
			projection.wantKey(t, "Order:A", []string{e0, e1, e2})
			waitDelivery(t, st, e2, "shipping", outbox.StatusNew)
			shipping.mu.Lock()
			early := slices.Clone(shipping.got["Order:A"])
			shipping.mu.Unlock()
			if len(early) != 0 {
				t.Fatalf("shipping delivered %v while it owed %s", early, e0)
			}
			broken.Store(false)
			shipping.wait(t, 20*time.Second)
			shipping.wantKey(t, "Order:A", []string{e0, e2})
		})
	}
}

// A key blocked for one subscription (its dead event, Ordered) holds back
// only that subscription, even when the key's next event is of a type
// only the blocked subscription takes: the other subscriptions' later
// events of the key still go out (found by the simulation, seed 14; the
// next event, not worth leasing for anyone but the blocked subscription,
// stayed whole and kept the whole key waiting).
func TestKeyBlockedForOneSubscriptionHoldsBackNoOther(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			e0 := outbox.NewID()
			ledger, audit := newKeyLog(t, 1), newKeyLog(t, 1)
			ledger.fail = func(ev outbox.Event) error {
				if ev.ID == e0 {
					return outbox.Permanent(errors.New("ledger refuses it"))
				}
				return nil
			}
			ob := startOrdered(t, st, outbox.Config{PollInterval: 50 * time.Millisecond},
				outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Handler: ledger.handle, Types: []outbox.EventType{"Charged"}},
				outbox.Subscription{Name: "audit", Order: outbox.OrderedSkipDead, Handler: audit.handle, Types: []outbox.EventType{"Noted"}})
			env := func(id string, typ outbox.EventType) outbox.Envelope {
				return outbox.Envelope{ID: id, Type: typ, AggregateType: "Account", AggregateID: "A", JSON: []byte(`{}`)}
			}
			publishInTx(t, ob, st, env(e0, "Charged"))
			waitDelivery(t, st, e0, "ledger", outbox.StatusDead)
			e1 := publishInTx(t, ob, st, env("", "Charged")) // waits for e0, for ledger
			e2 := publishInTx(t, ob, st, env("", "Noted"))   // audit's: nothing holds it back
			audit.wait(t, 20*time.Second)
			audit.wantKey(t, "Account:A", []string{e2})
			ledger.mu.Lock()
			early := slices.Clone(ledger.got["Account:A"])
			ledger.mu.Unlock()
			if len(early) != 0 {
				t.Errorf("ledger delivered %v behind its dead %s", early, e0)
			}
			if rec, err := st.Inspect(context.Background(), e1); err != nil {
				t.Fatal(err)
			} else if rec.Status == outbox.StatusDone {
				t.Errorf("%s is DONE while ledger's dead %s blocks its key", e1, e0)
			}
		})
	}
}

// An instance that publishes but does not run the ordered subscription
// (an API in front of workers) numbers the events of its types anyway: it
// learns at Start which subscriptions other instances run in order. The
// worker delivers them in order.
func TestPublisherWithoutTheOrderedSubscriptionNumbersEvents(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			quiet := slog.New(slog.DiscardHandler)
			worker, err := outbox.New(st, outbox.Config{InstanceID: "worker", Logger: quiet, PollInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			log := newKeyLog(t, 3)
			if err := worker.Subscribe(outbox.Subscription{Name: "projection", Order: outbox.Ordered, Handler: log.handle}); err != nil {
				t.Fatal(err)
			}
			if err := worker.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer worker.Close(ctx)
			api, err := outbox.New(st, outbox.Config{InstanceID: "api", Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			if err := api.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer api.Close(ctx)
			var want []string
			for range 3 {
				want = append(want, publishInTx(t, api, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "7", JSON: []byte(`{}`)}))
			}
			for i, id := range want {
				rec, err := st.Inspect(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if rec.OrderingKey != "Order:7" || rec.KeySeq != int64(i+1) {
					t.Errorf("event %d stored with key %q, number %d; want Order:7, %d", i, rec.OrderingKey, rec.KeySeq, i+1)
				}
			}
			log.wait(t, 20*time.Second)
			log.mu.Lock()
			defer log.mu.Unlock()
			if !slices.Equal(log.got["Order:7"], want) {
				t.Errorf("delivered as %v; want %v", log.got["Order:7"], want)
			}
		})
	}
}

// An event published while the one before it of its key is in the
// handler here is written leased to this instance and waits in memory
// behind it: it reaches the handler on the hot path the moment its
// predecessor is delivered, with no claim (the poll is an hour away).
// If the predecessor fails instead, the events behind it are given back
// to the table, and follow it in order once its retry succeeds.
func TestOrderedNextEventWaitsHereBehindItsPredecessor(t *testing.T) {
	for _, name := range testdb.Names {
		for _, fail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fail=%v", name, fail), func(t *testing.T) {
				db := testdb.Open(t, name)
				st := testdb.Store(t, db)
				poll := time.Hour
				if fail {
					poll = 50 * time.Millisecond // the retry of A1 comes by the poll
				}
				log := newKeyLog(t, 3)
				a1 := outbox.NewID()
				entered, gate := make(chan struct{}), make(chan struct{})
				var first sync.Once
				var paths sync.Map // id → outbox.Path of its successful delivery
				log.fail = func(ev outbox.Event) error {
					if ev.ID == a1 && ev.Attempt == 1 {
						first.Do(func() { close(entered) })
						<-gate
						if fail {
							return errors.New("first attempt fails")
						}
					}
					paths.Store(ev.ID, ev.Path)
					return nil
				}
				ob := startOrdered(t, st, outbox.Config{InstanceID: "here", PollInterval: poll, PollMaxInterval: poll},
					outbox.Subscription{Order: outbox.Ordered, Handler: log.handle, Retry: outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond })})
				env := func(i int) outbox.Envelope {
					return outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: fmt.Appendf(nil, `{"i":%d}`, i)}
				}
				first1 := env(1)
				first1.ID = a1
				want := []string{publishInTx(t, ob, st, first1)}
				<-entered
				for i := 2; i <= 3; i++ {
					id := publishInTx(t, ob, st, env(i))
					want = append(want, id)
					rec, err := st.Inspect(context.Background(), id)
					if err != nil {
						t.Fatal(err)
					}
					if rec.Owner != "here" {
						t.Errorf("event %d, published while event 1 is in the handler here, is leased to %q, want \"here\"", i, rec.Owner)
					}
				}
				close(gate)
				log.wait(t, 20*time.Second)
				log.wantKey(t, "Order:A", want)
				if !fail {
					for i, id := range want {
						if p, _ := paths.Load(id); p != outbox.PathHot {
							t.Errorf("event %d came by path %v, want hot", i+1, p)
						}
					}
				}
			})
		}
	}
}

// Close hands back the events waiting behind one in the handler: nothing
// stays leased to the closed instance, and another instance delivers
// them, in order, after the first.
func TestOrderedCloseHandsBackWaitingEvents(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			entered := make(chan struct{})
			var once sync.Once
			ob := startOrdered(t, st, outbox.Config{InstanceID: "closing", PollInterval: time.Hour, PollMaxInterval: time.Hour},
				outbox.Subscription{Order: outbox.Ordered, Handler: func(ctx context.Context, ev outbox.Event) error {
					once.Do(func() { close(entered) })
					<-ctx.Done() // cut by Close
					return ctx.Err()
				}})
			env := outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}
			ids := []string{publishInTx(t, ob, st, env)}
			<-entered
			ids = append(ids, publishInTx(t, ob, st, env), publishInTx(t, ob, st, env))
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			ob.Close(ctx)
			cancel()
			for i, id := range ids {
				rec, err := st.Inspect(context.Background(), id)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Owner != "" {
					t.Errorf("event %d still leased to %q after Close", i+1, rec.Owner)
				}
			}

			log := newKeyLog(t, 3)
			startOrdered(t, st, outbox.Config{InstanceID: "next", PollInterval: 50 * time.Millisecond}, outbox.Subscription{Order: outbox.Ordered, Handler: log.handle})
			log.wait(t, 20*time.Second)
			log.wantKey(t, "Order:A", ids)
		})
	}
}

// An event waiting here behind a slow one keeps its lease for as long as
// it waits (renewed with the one in the handler): another instance,
// polling all the while, never takes it, and the key is delivered once,
// in order, one event at a time.
func TestOrderedWaitingEventKeepsItsLease(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			// A lease long enough that renewals (every Lease/3) keep up on a
			// loaded machine: a call whose lease may run out is cancelled
			// (leaseBound), and its event delivered again.
			lease := time.Second
			log := newKeyLog(t, 3)
			var calls sync.Map // id → number of handler calls
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var a1 string
			log.fail = func(ev outbox.Event) error {
				n, _ := calls.LoadOrStore(ev.ID, new(atomic.Int32))
				if n.(*atomic.Int32).Add(1) > 1 {
					t.Errorf("event %s delivered more than once", ev.ID)
				}
				if ev.ID == a1 {
					once.Do(func() { close(entered) })
					<-gate
				} else {
					time.Sleep(lease / 4) // slow work: a lapsed lease would let "other" take the next event meanwhile
				}
				return nil
			}
			start := func(id string, poll time.Duration) *outbox.Outbox {
				return startOrdered(t, st, outbox.Config{InstanceID: id, Lease: lease, PollInterval: poll, PollMaxInterval: poll, SkipRecent: time.Millisecond},
					outbox.Subscription{Order: outbox.Ordered, Handler: log.handle})
			}
			here := start("here", time.Hour)
			start("other", 20*time.Millisecond)
			env := outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}
			first := env
			first.ID = outbox.NewID()
			a1 = first.ID
			want := []string{publishInTx(t, here, st, first)}
			<-entered
			want = append(want, publishInTx(t, here, st, env), publishInTx(t, here, st, env))
			time.Sleep(3 * lease) // time passing: without renewal the leases would have run out twice over
			close(gate)
			log.wait(t, 20*time.Second)
			log.wantKey(t, "Order:A", want)
		})
	}
}

// An event published on one instance while the event before it of its
// key is in the handler on another is written free (its publisher does
// not hold the key); the instance that finishes the one before learns
// from its DONE write that a later event waits, and claims it at once:
// no poll (an hour away on both) is needed.
func TestOrderedNextEventPublishedElsewhereIsClaimedAtOnce(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			log := newKeyLog(t, 2)
			a1 := outbox.NewID()
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var paths sync.Map // id → outbox.Path
			log.fail = func(ev outbox.Event) error {
				if ev.ID == a1 {
					once.Do(func() { close(entered) })
					<-gate
				}
				paths.Store(ev.ID, ev.Path)
				return nil
			}
			start := func(id string) *outbox.Outbox {
				return startOrdered(t, st, outbox.Config{InstanceID: id, PollInterval: time.Hour, PollMaxInterval: time.Hour},
					outbox.Subscription{Order: outbox.Ordered, Handler: log.handle})
			}
			first, second := start("first"), start("second")
			want := []string{publishInTx(t, first, st, outbox.Envelope{ID: a1, Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)})}
			<-entered
			a2 := publishInTx(t, second, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)})
			want = append(want, a2)
			rec, err := st.Inspect(context.Background(), a2)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Owner != "" {
				t.Errorf("A2, published on the instance that does not hold its key, is leased to %q; want free", rec.Owner)
			}
			close(gate)
			log.wait(t, 20*time.Second)
			log.wantKey(t, "Order:A", want)
			if p, _ := paths.Load(a2); p != outbox.PathCold {
				t.Errorf("A2 came by path %v, want cold (claimed after A1)", p)
			}
		})
	}
}

// ClaimHeads of keys whose head, or another event NEW or RETRY, is in
// flight under a live lease (typically named by the publisher of the
// event behind it, on another instance) claims nothing and opens no
// transaction; a free head is claimed in one.
func TestClaimHeadsOfKeysInFlightOpensNoTransaction(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db, begins := countedDB(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			f := driver.OrderFilter{Block: []string{"ord"}}
			insert := func(key, owner string) string {
				t.Helper()
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: key}
				if _, _, err := st.InsertOrdered(ctx, tx, &r, owner, time.Minute, f); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				return r.ID
			}
			claim := func(keys ...string) ([]driver.Row, int64) {
				t.Helper()
				before := begins.Load()
				rows, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: "b", Limit: 10, Lease: time.Minute}, keys, f)
				if err != nil {
					t.Fatal(err)
				}
				return rows, begins.Load() - before
			}
			insert("held", "a")        // the head, in a's hands
			insert("held", "")         // the event behind it
			insert("behind-retry", "") // its head goes back as a retry due in an hour
			if rows, _ := claim("behind-retry"); len(rows) != 1 {
				t.Fatalf("ClaimHeads(behind-retry) = %d rows; want its head", len(rows))
			} else if ok, err := st.MarkRetry(ctx, "b", rows[0].ID, time.Hour, "later"); err != nil || !ok {
				t.Fatalf("MarkRetry = %v, %v", ok, err)
			}
			if rows, n := claim("held", "behind-retry"); len(rows) != 0 || n != 0 {
				t.Errorf("ClaimHeads of a key in a's hands and one whose head is due in an hour = %d rows, %d transactions; want none, none", len(rows), n)
			}
			free := insert("free", "")
			if rows, n := claim("held", "free"); len(rows) != 1 || rows[0].ID != free || n != 1 {
				t.Errorf("ClaimHeads with a free head = %d rows, %d transactions; want the free head, in one", len(rows), n)
			}
		})
	}
}
