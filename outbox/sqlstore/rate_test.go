package sqlstore_test

import (
	"context"
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

// callLog records when each subscription received each event.
type callLog struct {
	mu    sync.Mutex
	times map[string][]time.Time          // subscription → call times
	ids   map[string]map[string]time.Time // subscription → event id → first call
}

func newCallLog() *callLog {
	return &callLog{times: map[string][]time.Time{}, ids: map[string]map[string]time.Time{}}
}

func (l *callLog) record(sub string, ids ...string) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ids[sub] == nil {
		l.ids[sub] = map[string]time.Time{}
	}
	for _, id := range ids {
		l.times[sub] = append(l.times[sub], now)
		if _, ok := l.ids[sub][id]; !ok {
			l.ids[sub][id] = now
		}
	}
}

func (l *callLog) distinct(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids[sub])
}

// lastCall is when sub first received the last of the events it took.
func (l *callLog) lastCall(sub string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var last time.Time
	for _, at := range l.ids[sub] {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// checkRate fails t if sub received more events by some time than a
// token bucket of rate and burst started at start lets through: the k-th
// call (from 1) needs k tokens, and by time at the bucket has given at
// most burst + rate × (at − start) (one more for the jitter between a
// token and the handler's clock).
func (l *callLog) checkRate(t *testing.T, sub string, start time.Time, rate float64, burst int) {
	t.Helper()
	l.mu.Lock()
	times := slices.Clone(l.times[sub])
	l.mu.Unlock()
	slices.SortFunc(times, time.Time.Compare)
	for k, at := range times {
		if allowed := float64(burst) + rate*at.Sub(start).Seconds() + 1; float64(k+1) > allowed {
			t.Fatalf("%s: call %d came %v after the engine started: at %v events/s and a burst of %d, at most %.1f calls fit by then",
				sub, k+1, at.Sub(start).Round(time.Millisecond), rate, burst, allowed)
		}
	}
}

// A subscription with a Rate receives no more than its rate allows, on
// every path (the hot path, the deliveries it was deferred to when its
// gate was full) and for a Batch subscription too; a subscription beside
// it (on the same events and on others) is not slowed, even with a
// single worker (no worker waits for a token); and every event reaches
// the limited subscriptions in the end.
func TestRateLimitPacesOnlyItsSubscription(t *testing.T) {
	const (
		rate   = 20
		events = 40 // of each type: twice what a gate holds, so half are deferred in the table
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			log := newCallLog()
			handler := func(sub string) outbox.Handler {
				return func(ctx context.Context, ev outbox.Event) error { log.record(sub, ev.ID); return nil }
			}
			start := time.Now()
			ob := startOrdered(t, st, outbox.Config{Workers: 1, PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond},
				outbox.Subscription{Name: "limited", Types: []outbox.EventType{"Slow"}, Rate: rate, Burst: 1, Handler: handler("limited")},
				outbox.Subscription{Name: "limited-batch", Types: []outbox.EventType{"Slow"}, Rate: rate, Burst: 1,
					Batch: func(ctx context.Context, evs []outbox.Event) error {
						ids := make([]string, len(evs))
						for i, ev := range evs {
							ids[i] = ev.ID
						}
						log.record("limited-batch", ids...)
						return nil
					}},
				outbox.Subscription{Name: "free", Handler: handler("free")})
			publishTypes(t, ob, st, events, "Slow", "Fast")
			waitUntil(t, 60*time.Second, "every event at every subscription", func() bool {
				return log.distinct("free") == 2*events && log.distinct("limited") == events && log.distinct("limited-batch") == events
			})
			log.checkRate(t, "limited", start, rate, 1)
			log.checkRate(t, "limited-batch", start, rate, 1)
			// The free subscription had everything long before the limited
			// ones: its last event came before they had half of theirs.
			freeDone := log.lastCall("free")
			for _, sub := range []string{"limited", "limited-batch"} {
				log.mu.Lock()
				before := 0
				for _, at := range log.ids[sub] {
					if !at.After(freeDone) {
						before++
					}
				}
				log.mu.Unlock()
				if before >= events/2 {
					t.Errorf("%s had %d of %d events when the subscription beside it had its last: the limit slowed the others", sub, before, events)
				}
			}
		})
	}
}

// publishTypes publishes n events of each type, one transaction per
// event.
func publishTypes(t *testing.T, ob *outbox.Outbox, st *sqlstore.Store, n int, types ...outbox.EventType) {
	t.Helper()
	for range n {
		for _, typ := range types {
			publishInTx(t, ob, st, outbox.Envelope{Type: typ, JSON: []byte(`{}`)})
		}
	}
}

// Close does not wait for a limited subscription's tokens: what its gate
// held is left in the table, not delivered and no attempt spent, and the
// next engine delivers every event.
func TestRateLimitedEventsWaitInTheTableAcrossClose(t *testing.T) {
	const events = 10
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			log := newCallLog()
			ob := startOrdered(t, st, outbox.Config{},
				outbox.Subscription{Name: "limited", Rate: 0.5, Burst: 1, Handler: func(ctx context.Context, ev outbox.Event) error {
					log.record("limited", ev.ID)
					return nil
				}})
			ids := make([]string, events)
			for i := range ids {
				ids[i] = publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", JSON: []byte(`{}`)})
			}
			waitUntil(t, 10*time.Second, "the first event delivered", func() bool { return log.distinct("limited") >= 1 })
			closeStart := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := ob.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(closeStart); took > 5*time.Second {
				t.Errorf("Close took %v: it waited for tokens", took)
			}
			delivered := log.distinct("limited")
			if delivered >= events {
				t.Fatalf("%d of %d events delivered at 0.5/s before Close: nothing was left to wait", delivered, events)
			}
			undelivered := 0
			for _, id := range ids {
				status, attempts := storedState(t, st, id, "limited")
				if status == outbox.StatusDone {
					continue
				}
				undelivered++
				if attempts != 0 || (status != outbox.StatusNew && status != outbox.StatusRetry) {
					t.Errorf("%s after Close: %v with %d attempts; want it owed, no attempt spent", id, status, attempts)
				}
			}
			if undelivered != events-delivered {
				t.Errorf("%d events owed after Close, %d delivered, of %d", undelivered, delivered, events)
			}
			// A new engine without the limit delivers the rest.
			startOrdered(t, st, outbox.Config{PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond},
				outbox.Subscription{Name: "limited", Handler: func(ctx context.Context, ev outbox.Event) error {
					log.record("limited", ev.ID)
					return nil
				}})
			waitUntil(t, 30*time.Second, "every event delivered by the next engine", func() bool { return log.distinct("limited") == events })
		})
	}
}

// Events that a limited subscription's full gate defers, beside a
// subscription that delivers them, are split many to a transaction: one
// transaction per event (written by the worker that settled it) held the
// subscription beside down to 4–5k events/s, where alone it drains 26–44k
// (BENCHMARKS.md, Rate limit). Each is split once, its delivery to the
// limited subscription owed.
func TestRateDeferralsAreSplitManyToATransaction(t *testing.T) {
	const events = 2000
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := &splitCounter{Store: testdb.Store(t, db)}
			insertFree(t, st.Store, db, events)
			var free atomic.Int64
			all := make(chan struct{})
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			for _, sub := range []outbox.Subscription{
				{Name: "limited", Rate: 1, Burst: 1, Handler: func(context.Context, outbox.Event) error { return nil }},
				{Name: "free", Handler: func(context.Context, outbox.Event) error {
					if free.Add(1) == events {
						close(all)
					}
					return nil
				}},
			} {
				if err := ob.Subscribe(sub); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-all:
			case <-ctx.Done():
				t.Fatalf("the free subscription had %d of %d events after a minute", free.Load(), events)
			}
			if err := ob.Close(ctx); err != nil { // writes what the completer holds
				t.Fatal(err)
			}
			calls, split := st.counts()
			t.Logf("%d events split in %d calls", split, calls)
			if split < events-5 {
				t.Fatalf("%d of %d events split; want all but the few the gate took", split, events)
			}
			if calls > split/10 {
				t.Errorf("%d events split in %d writes; want many to a write", split, calls)
			}
			// Owed, or delivered since from the table (its gate refilled):
			// no attempt spent either way.
			var owed int
			if err := db.QueryRow(`SELECT COUNT(*) FROM ` + st.DeliveriesTable() + ` WHERE subscription = 'limited' AND status IN (0, 1) AND attempts = 0`).Scan(&owed); err != nil {
				t.Fatal(err)
			}
			if owed != split {
				t.Errorf("%d deliveries to the limited subscription owed or delivered for %d events split; want one each", owed, split)
			}
		})
	}
}

// splitCounter counts the calls of Split and the events they split.
type splitCounter struct {
	*sqlstore.Store
	mu           sync.Mutex
	calls, split int
}

func (s *splitCounter) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	held, err := s.Store.Split(ctx, owner, splits, registry)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	for _, h := range held {
		if h {
			s.split++
		}
	}
	return held, err
}

func (s *splitCounter) counts() (calls, split int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls, s.split
}
