package sqlstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Subscriptions across instances through a rolling restart: three
// instances run different sets of subscriptions (one that takes every
// type, one typed whose destination is down for a while, a batch one and a
// Tx one, each failing some first attempts); twelve producers publish
// through any instance while the batch subscription is paused and resumed
// and one instance is replaced by a new one (a graceful Close). Every
// subscription gets every event it takes, the Tx one's effects committed
// exactly once (its handler may run again when its transaction was rolled
// back: a deadlock on MySQL, or another instance's record first).
func TestSubscriptionsAcrossInstancesThroughARollingRestart(t *testing.T) {
	const instances, producers = 3, 12
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			events := 400
			if name == "sqlite" {
				events = 150
			}
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			// The Tx subscription's effects, written in the delivery's
			// transaction: once per event however often its handler ran.
			effects := effectsTable(t, db)
			var mu sync.Mutex
			got := map[string]map[string]int{"all": {}, "posted": {}, "batch": {}, "tx": {}}
			var downSince time.Time
			rec := func(sub, id string) {
				mu.Lock()
				got[sub][id]++
				mu.Unlock()
			}
			typeOf := func(id string) outbox.EventType {
				if fnvOf(id)%3 == 0 {
					return "Voided"
				}
				return "Posted"
			}
			retry := outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond })
			all := outbox.Subscription{Name: "all", Retry: retry, Handler: func(ctx context.Context, ev outbox.Event) error {
				if ev.Attempt == 1 && fnvOf("all"+ev.ID)%5 == 0 {
					return errors.New("flaky")
				}
				rec("all", ev.ID)
				return nil
			}}
			posted := outbox.Subscription{Name: "posted", Types: []outbox.EventType{"Posted"}, Retry: retry, Handler: func(ctx context.Context, ev outbox.Event) error {
				if func() bool {
					mu.Lock()
					defer mu.Unlock()
					if downSince.IsZero() && fnvOf("posted"+ev.ID)%6 == 0 {
						downSince = time.Now()
					}
					return !downSince.IsZero() && time.Since(downSince) < 300*time.Millisecond
				}() {
					return outbox.Unavailable(errors.New("down"), 0)
				}
				rec("posted", ev.ID)
				return nil
			}}
			batch := outbox.Subscription{Name: "batch", Retry: retry, BatchSize: 7, Batch: func(ctx context.Context, evs []outbox.Event) error {
				be := &outbox.BatchError{Errs: make([]error, len(evs))}
				bad := false
				for i, ev := range evs {
					if ev.Attempt == 1 && fnvOf("batch"+ev.ID)%4 == 0 {
						be.Errs[i] = errors.New("flaky")
						bad = true
						continue
					}
					rec("batch", ev.ID)
				}
				if bad {
					return be
				}
				return nil
			}}
			txs := outbox.Subscription{Name: "tx", Retry: retry, Tx: func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
				if ev.Attempt == 1 && fnvOf("tx"+ev.ID)%5 == 0 {
					return errors.New("flaky")
				}
				return project(effects, "any", func(ev outbox.Event) { rec("tx", ev.ID) })(ctx, tx, ev)
			}}
			subsOf := func(i int) []outbox.Subscription {
				switch i {
				case 0:
					return []outbox.Subscription{all, posted, batch, txs}
				case 1:
					return []outbox.Subscription{posted, batch}
				}
				return []outbox.Subscription{txs}
			}
			var omu sync.RWMutex
			var obs []*outbox.Outbox
			for i := range instances {
				obs = append(obs, startOrdered(t, st, instance(i), subsOf(i)...))
			}
			var ids sync.Map
			var next sync.Mutex
			left := events
			// Resume waits for Pause: the producer that pauses may be
			// scheduled after the one that resumes.
			paused := make(chan struct{})
			var wg sync.WaitGroup
			for p := range producers {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(p), 6))
					for {
						next.Lock()
						left--
						l := left
						next.Unlock()
						if l < 0 {
							return
						}
						switch l {
						case 3 * events / 4:
							if err := obs[2].Pause(context.Background(), "batch"); err != nil {
								t.Error("pause", err)
							}
							close(paused)
						case events / 2:
							omu.Lock()
							old := obs[1]
							go old.Close(context.Background())
							obs[1] = startOrdered(t, st, instance(3), subsOf(1)...)
							omu.Unlock()
						case events / 4:
							<-paused
							if err := obs[0].Resume(context.Background(), "batch"); err != nil {
								t.Error("resume", err)
							}
						}
						omu.RLock()
						ob := obs[rnd.IntN(instances)]
						omu.RUnlock()
						env := outbox.Envelope{ID: outbox.NewID(), AggregateType: "Acct", AggregateID: strconv.Itoa(rnd.IntN(50)), JSON: []byte(`{}`)}
						env.Type = typeOf(env.ID)
						ids.Store(env.ID, env.Type)
						publishInTx(t, ob, st, env)
					}
				})
			}
			wg.Wait()
			missing := func() map[string]int {
				out := map[string]int{}
				ids.Range(func(k, v any) bool {
					id := k.(string)
					mu.Lock()
					defer mu.Unlock()
					for sub := range got {
						if got[sub][id] == 0 && (sub != "posted" || v.(outbox.EventType) == "Posted") {
							out[sub]++
						}
					}
					return true
				})
				return out
			}
			deadline := time.Now().Add(60 * time.Second)
			for m := missing(); len(m) > 0; m = missing() {
				if time.Now().After(deadline) {
					// What the table says of a few of them, to tell a lost
					// event from one waiting on a lease or a pause.
					shown := 0
					ids.Range(func(k, v any) bool {
						id := k.(string)
						mu.Lock()
						lost := got["batch"][id] == 0 || got["all"][id] == 0 || got["tx"][id] == 0
						mu.Unlock()
						if lost && shown < 5 {
							shown++
							rec, err := st.Inspect(context.Background(), id)
							t.Logf("undelivered %s: %+v (%v)", id, rec, err)
						}
						return shown < 5
					})
					subs, err := st.Subscriptions(context.Background())
					t.Logf("subscriptions: %+v (%v)", subs, err)
					t.Fatalf("after 60s, events not delivered, by subscription: %v", m)
				}
				time.Sleep(10 * time.Millisecond)
			}
			total := 0
			ids.Range(func(any, any) bool { total++; return true })
			waitUntil(t, 30*time.Second, "the Tx subscription's effects committed for every event", func() bool {
				var n int
				if err := db.Get(&n, `SELECT COUNT(DISTINCT event_id) FROM `+effects); err != nil {
					t.Fatal(err)
				}
				return n == total
			})
			var twice []struct {
				ID string `db:"event_id"`
				N  int    `db:"n"`
			}
			if err := db.Select(&twice, `SELECT event_id, COUNT(*) AS n FROM `+effects+` GROUP BY event_id HAVING COUNT(*) > 1`); err != nil {
				t.Fatal(err)
			}
			for _, e := range twice {
				t.Errorf("the Tx subscription's effect of %s committed %d times", e.ID, e.N)
			}
		})
	}
}

// A rolling deploy that adds a subscription: instance OLD has "a",
// instance NEW starts with "a" and "b", both taking the event type, while
// producers publish through OLD without pause. OLD learns of "b" only at
// its next refresh (a PollInterval far longer than the test's publishing),
// yet every event committed after NEW's registration (its Start returned)
// is owed to "b" and must reach it: OLD must not complete them for "a"
// alone (the registry fence: driver.ErrRegistryChanged).
func TestSubscriptionAddedByAnotherInstanceIsOwedFromItsRegistration(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			var mu sync.Mutex
			got := map[string]map[string]int{"a": {}, "b": {}}
			sub := func(n string) outbox.Subscription {
				return outbox.Subscription{Name: n, Types: []outbox.EventType{"Posted"}, Handler: func(ctx context.Context, ev outbox.Event) error {
					mu.Lock()
					got[n][ev.ID]++
					mu.Unlock()
					return nil
				}}
			}
			old := startOrdered(t, st, outbox.Config{InstanceID: "old", PollInterval: 3 * time.Second}, sub("a"))
			publish := func() string {
				return publishInTx(t, old, st, outbox.Envelope{ID: outbox.NewID(), Type: "Posted", AggregateType: "Acct", AggregateID: "1", JSON: []byte(`{}`)})
			}
			for range 20 {
				publish()
			}
			startOrdered(t, st, outbox.Config{InstanceID: "new", PollInterval: 50 * time.Millisecond}, sub("a"), sub("b"))
			// NEW's Start returned: "b" is registered. Everything whose
			// transaction begins now commits after that.
			var owed []string
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				owed = append(owed, publish())
			}
			missing := func() (n int, first string) {
				mu.Lock()
				defer mu.Unlock()
				for _, id := range owed {
					if got["b"][id] == 0 {
						if n == 0 {
							first = id
						}
						n++
					}
				}
				return n, first
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				n, first := missing()
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					rec, err := st.Inspect(context.Background(), first)
					t.Fatalf("%d of %d events committed after NEW registered \"b\" never reached \"b\"; the first: status %v, deliveries %+v (%v)",
						n, len(owed), rec.Status, rec.Deliveries, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("%d events committed after the registration, every one delivered to b", len(owed))
		})
	}
}

// regNow returns the registry's version now, for a completing write
// (MarkDone, MarkDoneKeys, Split) that must not be refused for a stale
// registry.
func regNow(t testing.TB, st *sqlstore.Store) int64 {
	t.Helper()
	reg, err := st.SyncSubscriptions(context.Background(), nil)
	if err != nil {
		t.Fatalf("SyncSubscriptions: %v", err)
	}
	return reg.Version
}

// splitOne is Split of one event.
func splitOne(ctx context.Context, st *sqlstore.Store, owner, id string, writes []driver.DeliveryWrite, registry int64) (bool, error) {
	held, err := st.Split(ctx, owner, []driver.EventSplit{{EventID: id, Writes: writes}}, registry)
	return err == nil && len(held) == 1 && held[0], err
}
