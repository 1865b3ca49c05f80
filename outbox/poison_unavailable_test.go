package outbox_test

import (
	"context"
	"errors"
	"log/slog"
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
		// an event a minute for ten minutes.
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
		for i := range 10 {
			published[publishKey(t, ob, st, "other", i)] = time.Now()
			settle(time.Minute)
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
