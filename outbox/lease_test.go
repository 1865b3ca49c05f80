package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// renewalsDown is a store whose lease renewals fail while down is set:
// the database unreachable for the instance that renews.
type renewalsDown struct {
	*outboxtest.Store
	down atomic.Bool
}

func (s *renewalsDown) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	if s.down.Load() {
		return 0, errors.New("the database is unreachable")
	}
	return s.Store.ExtendLeases(ctx, owner, ids, lease)
}

// An event an instance holds in its queue while no renewal of its lease
// succeeds for a whole lease is not delivered there afterwards: another
// instance may have claimed it meanwhile (here one did, and delivered it),
// and two deliveries of it would run at once. Before, the instance
// delivered it from its queue all the same.
func TestEventWhoseLeaseRanOutInTheQueueIsNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := &renewalsDown{Store: outboxtest.NewStore()}
		const lease = time.Second
		first, second := outbox.NewID(), outbox.NewID()
		var mu sync.Mutex
		calls := map[string][]string{} // event id -> instances that delivered it
		release := make(chan struct{})
		start := func(name string) *outbox.Outbox {
			ob, err := outbox.New(st, outbox.Config{InstanceID: name, Logger: slog.New(slog.DiscardHandler), Lease: lease,
				PollInterval: 100 * time.Millisecond, Workers: 1, SkipRecent: -1})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("mail", func(ctx context.Context, ev outbox.Event) error {
				mu.Lock()
				calls[ev.ID] = append(calls[ev.ID], name)
				mu.Unlock()
				if ev.ID == first && name == "a" {
					<-release // a's only worker is busy with the first event
				}
				return nil
			})
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close(ctx) })
			return ob
		}
		a := start("a")
		tx := st.Begin(ctx)
		for _, id := range []string{first, second} {
			if _, err := a.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Mailed", JSON: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // a's worker is in the first event; the second waits in a's queue
		st.down.Store(true)
		time.Sleep(2 * lease) // no renewal of a's leases succeeds
		start("b")            // takes both over once their leases ran out
		time.Sleep(2 * lease)
		st.down.Store(false)
		close(release)
		time.Sleep(2 * lease)
		mu.Lock()
		defer mu.Unlock()
		if got := calls[second]; len(got) != 1 {
			t.Errorf("the second event was delivered by %v; want once (a's lease on it had run out when a's worker came to it)", got)
		}
	})
}
