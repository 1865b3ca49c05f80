package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// One event the destination always answers "unavailable" (a webhook that
// returns 503 for that payload only), while it takes every other event:
// it must not hold the subscription up, and, since the destination is
// evidently up, its failures count as attempts until it is DEAD.
func TestAnEventAlwaysUnavailableStallsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		var mu sync.Mutex
		delivered := map[string]time.Time{}
		poisonCalls := 0
		var poison string
		ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "hook", MaxAttempts: 5,
			Retry: outbox.RetryFunc(func(int) time.Duration { return 5 * time.Second }),
			Handler: func(ctx context.Context, ev outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if ev.ID == poison {
					poisonCalls++
					return outbox.Unavailable(errors.New("503 Service Unavailable"), 0)
				}
				delivered[ev.ID] = time.Now()
				return nil
			}}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer ob.Close(context.Background())

		// The poison event alone, long enough to open the circuit, then
		// an event every 10 s for ten minutes.
		mu.Lock()
		poison = "pending"
		mu.Unlock()
		tx := st.Begin(context.Background())
		id, err := ob.PublishTx(context.Background(), tx, outbox.Envelope{Type: "Changed", AggregateID: "p", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		poison = id
		mu.Unlock()
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		settle(20 * time.Second)
		published := map[string]time.Time{}
		for i := range 60 {
			published[publishKey(t, ob, st, "other", i)] = time.Now()
			settle(10 * time.Second)
		}
		settle(10 * time.Minute)

		mu.Lock()
		defer mu.Unlock()
		for id, at := range published {
			got, ok := delivered[id]
			switch {
			case !ok:
				t.Errorf("event %s, published at %v, never delivered", id, at)
			case got.Sub(at) > 35*time.Second:
				t.Errorf("event %s waited %v behind the event the destination refuses", id, got.Sub(at))
			}
		}
		if !deadFor(t, st, poison, "hook") {
			t.Errorf("the event the destination always refuses is not DEAD after %d calls; want DEAD once its attempts (5) are spent", poisonCalls)
		}
	})
}

// A destination that is down now and then, under steady publishing for
// ten minutes: flapping (down 10 s, up 10 s), or overloaded (refusing 60 %
// of calls at random). Its refusals are outages, never the events' fault,
// however often an event meets one: no event goes DEAD, and every one is
// delivered once the destination stays up.
func TestAnUnsteadyDestinationKillsNoEvent(t *testing.T) {
	for _, c := range []struct {
		name string
		down func(since time.Duration, rnd *rand.Rand) bool
	}{
		{"flapping", func(since time.Duration, _ *rand.Rand) bool { return (since/(10*time.Second))%2 == 1 }},
		{"overloaded", func(_ time.Duration, rnd *rand.Rand) bool { return rnd.Float64() < 0.6 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := outboxtest.NewStore()
				start := time.Now()
				rnd := rand.New(rand.NewPCG(1, 2))
				var mu sync.Mutex
				delivered := map[string]bool{}
				ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Subscribe(outbox.Subscription{Name: "hook", MaxAttempts: 3,
					Retry: outbox.RetryFunc(func(int) time.Duration { return time.Second }),
					Handler: func(ctx context.Context, ev outbox.Event) error {
						mu.Lock()
						defer mu.Unlock()
						if since := time.Since(start); since < 10*time.Minute && c.down(since, rnd) {
							return outbox.Unavailable(errors.New("503 Service Unavailable"), 0)
						}
						delivered[ev.ID] = true
						return nil
					}}); err != nil {
					t.Fatal(err)
				}
				if err := ob.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				defer ob.Close(context.Background())
				var ids []string
				for i := 0; time.Since(start) < 10*time.Minute; i++ {
					ids = append(ids, publishKey(t, ob, st, "k"+strconv.Itoa(i%7), i))
					settle(700 * time.Millisecond)
				}
				settle(2 * time.Minute)
				mu.Lock()
				defer mu.Unlock()
				missing, dead := 0, 0
				for _, id := range ids {
					if delivered[id] {
						continue
					}
					missing++
					if deadFor(t, st, id, "hook") {
						dead++
					}
				}
				if missing > 0 {
					t.Errorf("of %d events published while the destination was unsteady, %d not delivered after it stayed up (%d DEAD)", len(ids), missing, dead)
				}
			})
		})
	}
}
