package outbox_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// callTimes records when each subscription received each event.
type callTimes struct {
	mu    sync.Mutex
	at    map[string][]time.Duration // subscription → call times since start
	seen  map[string]map[string]int  // subscription → event id → calls
	start time.Time
}

func newCallTimes() *callTimes {
	return &callTimes{at: map[string][]time.Duration{}, seen: map[string]map[string]int{}, start: time.Now()}
}

func (a *callTimes) handler(sub string) outbox.Handler {
	return func(ctx context.Context, ev outbox.Event) error {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.at[sub] = append(a.at[sub], time.Since(a.start))
		if a.seen[sub] == nil {
			a.seen[sub] = map[string]int{}
		}
		a.seen[sub][ev.ID]++
		return nil
	}
}

// A subscription with a Rate receives its events at that rate, a backlog
// three times what its gate holds included (the rest waits in the table
// and is claimed as the gate empties), each event once; the subscription
// beside it takes all of them at once.
func TestRateLimitDeliversAtItsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate   = 100
			events = 3 * rate
		)
		st := outboxtest.NewStore()
		a := newCallTimes()
		ob := startedOutbox(t, st, outbox.Config{},
			outbox.Subscription{Name: "limited", Rate: rate, Burst: 1, Handler: a.handler("limited")},
			outbox.Subscription{Name: "free", Handler: a.handler("free")})
		for range events {
			publishOneTo(t, ob, st)
		}
		settle(10 * time.Second)
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, sub := range []string{"limited", "free"} {
			if len(a.seen[sub]) != events || len(a.at[sub]) != events {
				t.Fatalf("%s: %d calls for %d of %d events; want each event once", sub, len(a.at[sub]), len(a.seen[sub]), events)
			}
		}
		if last := a.at["free"][events-1]; last > 100*time.Millisecond {
			t.Errorf("the subscription beside the limited one had its last event at %v; want all at once", last)
		}
		times := a.at["limited"]
		span := times[events-1] - times[0]
		got := float64(events-1) / span.Seconds()
		t.Logf("limited: %d events in %v, %.2f/s", events, span, got)
		if got > rate*1.001 || got < rate*0.95 {
			t.Errorf("limited: %d events in %v, %.1f/s; want %d/s (at most, and within 5%%)", events, span, got, rate)
		}
		for i := 1; i < events; i++ {
			if gap := times[i] - times[i-1]; gap < time.Second/rate-time.Microsecond {
				t.Fatalf("limited: calls %d and %d %v apart; want at least %v at %d/s with a burst of 1", i, i+1, gap, time.Second/rate, rate)
			}
		}
	})
}

// A limited subscription keeps its rate while a backlog of other events
// drains beside it through the poller: the claims of whole events fill
// every poll's limit while the backlog lasts, and a gate at least half
// empty is refilled from the table before them (it got 100 events of its
// own backlog in a 5 s drain at 100/s before, the first second's).
func TestRateLimitKeepsItsRateBesideADrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate  = 100
			drain = 10_000
		)
		st := outboxtest.NewStore()
		// Published by an instance without subscriptions: all of it waits
		// in the table for the other's polls.
		pub := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour})
		for range 10 * rate {
			publishEnv(t, pub, st, outbox.Envelope{Type: "Slow", JSON: []byte(`{}`)})
		}
		for range drain {
			publishEnv(t, pub, st, outbox.Envelope{Type: "Fast", JSON: []byte(`{}`)})
		}
		a := newCallTimes()
		free := a.handler("free")
		startedOutbox(t, st, outbox.Config{},
			outbox.Subscription{Name: "limited", Types: []outbox.EventType{"Slow"}, Rate: rate, Burst: 1, Handler: a.handler("limited")},
			outbox.Subscription{Name: "free", Types: []outbox.EventType{"Fast"}, Handler: func(ctx context.Context, ev outbox.Event) error {
				time.Sleep(2 * time.Millisecond) // a drain that takes a few seconds
				return free(ctx, ev)
			}})
		settle(20 * time.Second)
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.seen["free"]) != drain {
			t.Fatalf("free: %d of %d events", len(a.seen["free"]), drain)
		}
		// Over the drain, after a second of warm-up.
		from, to := a.at["free"][0]+time.Second, a.at["free"][drain-1]
		if to-from < 3*time.Second {
			t.Fatalf("the drain took %v: too short to tell", to-from)
		}
		during := 0
		for _, at := range a.at["limited"] {
			if at >= from && at <= to {
				during++
			}
		}
		want := 0.95 * rate * (to - from).Seconds()
		t.Logf("limited: %d events in %v of the drain (%.1f/s)", during, to-from, float64(during)/(to-from).Seconds())
		if float64(during) < want {
			t.Errorf("limited: %d events in %v of the drain; want at least %.0f (95 %% of %d/s)", during, to-from, want, rate)
		}
	})
}

// A Batch subscription with a Rate counts each event of a call.
func TestRateLimitCountsTheEventsOfABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate   = 50
			events = 100
		)
		st := outboxtest.NewStore()
		var mu sync.Mutex
		var got []time.Duration
		start := time.Now()
		ob := startedOutbox(t, st, outbox.Config{},
			outbox.Subscription{Name: "batched", Rate: rate, Burst: 10, Batch: func(ctx context.Context, evs []outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				for range evs {
					got = append(got, time.Since(start))
				}
				return nil
			}})
		for range events {
			publishOneTo(t, ob, st)
		}
		settle(10 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		if len(got) != events {
			t.Fatalf("%d events delivered; want %d", len(got), events)
		}
		// Each event needs a token: the k-th by 10 + 50 × t.
		for k, at := range got {
			if float64(k+1) > 10+rate*at.Seconds()+1e-9 {
				t.Fatalf("event %d delivered at %v: more than a burst of 10 and %d/s allow", k+1, at, rate)
			}
		}
	})
}

// Close does not wait for tokens: what the gate held is left owed in the
// store, no attempt spent.
func TestCloseLeavesWhatTheGateHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		a := newCallTimes()
		ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "limited", Rate: 1, Handler: a.handler("limited")}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		ids := make([]string, 5)
		for i := range ids {
			ids[i] = publishOneTo(t, ob, st)
		}
		settle(500 * time.Millisecond)
		start := time.Now()
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 100*time.Millisecond {
			t.Errorf("Close took %v of virtual time: it waited for tokens", took)
		}
		a.mu.Lock()
		delivered := a.seen["limited"]
		a.mu.Unlock()
		if len(delivered) != 1 {
			t.Fatalf("%d events delivered in the first half second at 1/s; want 1", len(delivered))
		}
		for _, id := range ids {
			status, attempts := deliveryState(t, st, id, "limited")
			if delivered[id] > 0 {
				continue
			}
			if status != outbox.StatusNew || attempts != 0 {
				t.Errorf("%s after Close: %v with %d attempts; want NEW, no attempt spent", id, status, attempts)
			}
		}
	})
}

// Rate and Burst out of range fail at Subscribe, naming the field and
// the fix.
func TestRateValidation(t *testing.T) {
	for _, c := range []struct {
		s    outbox.Subscription
		want string
	}{
		{outbox.Subscription{Rate: -1}, "Rate is -1"},
		{outbox.Subscription{Rate: 2e6}, "Rate is 2e+06"},
		{outbox.Subscription{Burst: 5}, "Burst is 5 but Rate is 0"},
		{outbox.Subscription{Rate: 10, Burst: -1}, "Burst is -1"},
		{outbox.Subscription{Rate: 10, Burst: 20_000}, "Burst is 20000; it must be at most 10000"},
	} {
		ob, err := outbox.New(outboxtest.NewStore(), outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		c.s.Name, c.s.Handler = "limited", func(context.Context, outbox.Event) error { return nil }
		err = ob.Subscribe(c.s)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"limited"`) {
			t.Errorf("Subscribe(Rate %v, Burst %d) = %v; want an error naming the subscription and saying %q", c.s.Rate, c.s.Burst, err, c.want)
		}
	}
}
