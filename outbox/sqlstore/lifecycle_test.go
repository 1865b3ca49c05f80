package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The life of a subscription (outbox/retire.go, issue 33 defect 5): owed
// from its registration on, settled when it is retired; an event no
// subscription anywhere takes is complete at once; an instance claims only
// what its own subscriptions take.

// noListeners counts the events an instance claimed or was handed but had
// no subscription for (and for an event no subscription anywhere takes,
// completed without delivery).
type noListeners struct {
	outbox.NopMetrics
	n atomic.Int64
}

func (m *noListeners) NoListener(outbox.EventType) { m.n.Add(1) }

func typedEnv(typ outbox.EventType) outbox.Envelope {
	return outbox.Envelope{Type: typ, AggregateType: "Account", AggregateID: "A", JSON: []byte(`{}`)}
}

// An event of a type that no subscription on any instance takes is DONE
// after one claim, with no attempt spent, instead of being claimed and
// handed back every NoListenerDelay for ever.
func TestEventOfATypeNoSubscriptionTakesIsCompletedAtOnce(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ob := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, NoListenerDelay: time.Hour},
				outbox.Subscription{Name: "accounts", Types: []outbox.EventType{"Opened"},
					Handler: func(context.Context, outbox.Event) error { return nil }})
			id := publishInTx(t, ob, st, typedEnv("Nobody.Takes.This"))
			waitStatus(t, st, id, outbox.StatusDone)
			rec, err := st.Inspect(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Attempts != 0 || len(rec.Deliveries) != 0 {
				t.Errorf("completed with %d attempts and deliveries %+v; want none", rec.Attempts, rec.Deliveries)
			}
		})
	}
}

// An instance does not claim the events of a type that only another
// instance's subscription takes: it could only hand them back (for
// NoListenerDelay, delaying the instance that has the subscription).
func TestInstanceClaimsOnlyTheTypesItsSubscriptionsTake(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ctx := context.Background()
			// "shipping", on another instance (registered, not running
			// now), takes Shipped.
			if _, err := st.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "shipping", Types: []string{"Shipped"}}}); err != nil {
				t.Fatal(err)
			}
			m := &noListeners{}
			ob := startOrdered(t, st, outbox.Config{PollInterval: 10 * time.Millisecond, Metrics: m, SkipRecent: -1},
				outbox.Subscription{Name: "accounts", Types: []outbox.EventType{"Opened"},
					Handler: func(context.Context, outbox.Event) error { return nil }})
			var shipped []string
			for range 5 {
				shipped = append(shipped, publishInTx(t, ob, st, typedEnv("Shipped")))
			}
			// An event of its own type published after them is delivered:
			// every poll that could have taken the others has run.
			opened := publishInTx(t, ob, st, typedEnv("Opened"))
			waitStatus(t, st, opened, outbox.StatusDone)
			for range 3 {
				if _, err := ob.Poll(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := m.n.Load(); n != 0 {
				t.Errorf("the instance claimed %d events of a type only another instance's subscription takes; want 0", n)
			}
			for _, id := range shipped {
				rec, err := st.Inspect(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Status != outbox.StatusNew || rec.Attempts != 0 || rec.Owner != "" {
					t.Errorf("%s: status %v, attempts %d, owner %q; want NEW, 0 and none", id, rec.Status, rec.Attempts, rec.Owner)
				}
			}
		})
	}
}

// Retire settles what a subscription removed from every instance still
// owed: its deliveries dropped and counted, the events that waited only
// for them DONE; Lag lists it, unregistered, until then, and not after.
// It refuses a subscription that an instance still registers.
func TestRetireSettlesWhatASubscriptionOwed(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			const n = 4
			old := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, InstanceID: "old"},
				outbox.Subscription{Name: "keep", Handler: func(context.Context, outbox.Event) error { return nil }},
				outbox.Subscription{Name: "gone", Retry: outbox.RetryFunc(func(int) time.Duration { return time.Hour }),
					Handler: func(context.Context, outbox.Event) error { return errors.New("gone is failing") }})
			var ids []string
			for range n {
				ids = append(ids, publishInTx(t, old, st, typedEnv("Opened")))
			}
			for _, id := range ids {
				waitDelivery(t, st, id, "gone", outbox.StatusRetry)
			}
			if err := old.Close(ctx); err != nil {
				t.Fatal(err)
			}
			// The new deploy: "keep" only, not started (an operator's
			// process).
			ob, err := outbox.New(st, outbox.Config{InstanceID: "new", PollInterval: 20 * time.Millisecond, SubscriptionExpiry: 300 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Subscribe(outbox.Subscription{Name: "keep", Handler: func(context.Context, outbox.Event) error { return nil }}); err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Retire(ctx, "keep"); !errors.Is(err, outbox.ErrSubscriptionLive) {
				t.Errorf("Retire of the instance's own subscription: %v; want ErrSubscriptionLive", err)
			}
			// An instance that still runs "gone" registers it.
			if _, err := st.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "gone"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := ob.Retire(ctx, "gone"); !errors.Is(err, outbox.ErrSubscriptionLive) {
				t.Errorf("Retire of a subscription registered just now: %v; want ErrSubscriptionLive", err)
			}
			lag := lagOf(t, ob, "gone")
			if !lag.Unregistered || lag.Retrying != n {
				t.Errorf("Lag of gone before Retire: %+v; want Unregistered with %d retrying", lag, n)
			}
			var r outbox.Retired
			for deadline := time.Now().Add(20 * time.Second); ; {
				if r, err = ob.Retire(ctx, "gone"); !errors.Is(err, outbox.ErrSubscriptionLive) || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond) // until no instance registered it for RetireIdle
			}
			if err != nil {
				t.Fatal(err)
			}
			if !r.Registered || r.Dropped != n || r.Completed != n {
				t.Errorf("Retire: %+v; want registered, %d dropped, %d completed", r, n, n)
			}
			for _, id := range ids {
				rec, err := st.Inspect(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if rec.Status != outbox.StatusDone {
					t.Errorf("%s: %v after Retire; want DONE", id, rec.Status)
				}
			}
			if l := lagOf(t, ob, "gone"); l.Subscription != "" {
				t.Errorf("Lag lists gone after Retire: %+v", l)
			}
			stats, err := st.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if stats.Split != 0 || stats.Pending() != 0 {
				t.Errorf("Stats after Retire: %+v; want nothing split or pending", stats)
			}
		})
	}
}

// A subscription that no instance has registered for SubscriptionExpiry
// is retired by a running instance, and what it owed is settled.
func TestExpiredSubscriptionIsRetired(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ctx := context.Background()
			old := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, InstanceID: "old"},
				outbox.Subscription{Name: "keep", Handler: func(context.Context, outbox.Event) error { return nil }},
				outbox.Subscription{Name: "gone", Retry: outbox.RetryFunc(func(int) time.Duration { return time.Hour }),
					Handler: func(context.Context, outbox.Event) error { return errors.New("gone is failing") }})
			var ids []string
			for range 3 {
				ids = append(ids, publishInTx(t, old, st, typedEnv("Opened")))
			}
			for _, id := range ids {
				waitDelivery(t, st, id, "gone", outbox.StatusRetry)
			}
			if err := old.Close(ctx); err != nil {
				t.Fatal(err)
			}
			startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, InstanceID: "new", SubscriptionExpiry: 300 * time.Millisecond},
				outbox.Subscription{Name: "keep", Handler: func(context.Context, outbox.Event) error { return nil }})
			for _, id := range ids {
				waitStatus(t, st, id, outbox.StatusDone)
			}
			subs, err := st.Subscriptions(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range subs {
				if s.Name == "gone" {
					t.Errorf("gone is still registered: %+v", s)
				}
			}
		})
	}
}

// lagOf returns ob.Lag's entry for sub, or a zero Lag.
func lagOf(t *testing.T, ob *outbox.Outbox, sub string) outbox.Lag {
	t.Helper()
	lags, err := ob.Lag(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lags {
		if l.Subscription == sub {
			return l
		}
	}
	return outbox.Lag{}
}

// An instance whose view of the registry is stale completes events for
// the subscriptions it knows; the store refuses the DONE (the registry
// fence), and the instance then records what the new subscription is
// owed, a delivery for it, without running the subscriptions that had
// the event again. (Before, it handed the whole event back, and every
// subscription got it twice: seed 5545 of the simulation saw such a
// second delivery of an ordered event run beside a later event of its
// key.)
func TestFencedCompletionGoesToTheNewSubscriptionOnly(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ctx := context.Background()
			var mu sync.Mutex
			got := map[string]int{}
			old := startOrdered(t, st, outbox.Config{InstanceID: "old", PollInterval: time.Hour},
				outbox.Subscription{Name: "a", Handler: func(ctx context.Context, ev outbox.Event) error {
					mu.Lock()
					got[ev.ID]++
					mu.Unlock()
					return nil
				}})
			// "b" registered by an instance old has not heard of (its next
			// refresh is an hour away).
			if _, err := st.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "b"}}); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for range 5 {
				ids = append(ids, publishInTx(t, old, st, typedEnv("Opened")))
			}
			for _, id := range ids {
				waitDelivery(t, st, id, "b", outbox.StatusNew)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				if got[id] != 1 {
					t.Errorf("%s delivered to a %d times; want once (only b, registered since, is owed it again)", id, got[id])
				}
			}
		})
	}
}
