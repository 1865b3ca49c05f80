package outboxtest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// Drain delivers an ordered subscription's keys in order and returns
// when the rest waits behind a dead event (a blocked key is not work
// that is due), then delivers the rest once the event is skipped.
func TestDrainOrderedBlockedKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st := outboxtest.NewStore()
		var mu sync.Mutex
		var got []string
		var bad string
		ob := started(t, st, outbox.Config{}, func(ob *outbox.Outbox) {
			err := ob.Subscribe(outbox.Subscription{Name: "proj", Order: outbox.Ordered, Handler: func(ctx context.Context, ev outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				if ev.ID == bad {
					return outbox.Permanent(errors.New("broken"))
				}
				got = append(got, ev.ID)
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
		})
		publish := func(agg string) string {
			tx := st.Begin(ctx)
			id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, AggregateType: "Order", AggregateID: agg, JSON: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			return id
		}
		a1 := publish("A")
		mu.Lock()
		bad = publish("A")
		mu.Unlock()
		a3 := publish("A")
		b1 := publish("B")
		if err := st.Drain(ctx, ob); err != nil {
			t.Fatalf("Drain with a blocked key: %v", err)
		}
		mu.Lock()
		if len(got) != 2 || !slices.Contains(got, a1) || !slices.Contains(got, b1) {
			t.Fatalf("delivered %v; want A1 and B1 (%s, %s), not A3 behind the dead A2", got, a1, b1)
		}
		mu.Unlock()
		if n, err := ob.SkipDead(ctx, bad); err != nil || n != 1 {
			t.Fatalf("SkipDead = %d, %v", n, err)
		}
		if err := st.Drain(ctx, ob); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 3 || got[2] != a3 {
			t.Fatalf("delivered %v; want A3 last", got)
		}
	})
}
