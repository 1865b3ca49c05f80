package sqlstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// renewalsDown is a store whose lease renewals fail while down is set,
// as for an instance cut off from the database.
type renewalsDown struct {
	*sqlstore.Store
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
// instance took it over and delivered it meanwhile, and a delivery from
// the queue would be a second one running at once (the simulation's seed
// 2281 and 4502: two events of one key in flight after a freeze).
func TestEventWhoseLeaseRanOutInTheQueueIsNotDeliveredThere(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			base := testdb.Store(t, testdb.Open(t, name))
			st := &renewalsDown{Store: base}
			ctx := context.Background()
			const lease = time.Second
			first, second := outbox.NewID(), outbox.NewID()
			var mu sync.Mutex
			calls := map[string][]string{}
			hold := make(chan struct{})
			defer close(hold)
			start := func(inst string) *outbox.Outbox {
				cfg := outbox.Config{InstanceID: inst, Lease: lease, PollInterval: 50 * time.Millisecond, Workers: 1, SkipRecent: -1}
				cfg.Logger = slog.New(slog.DiscardHandler)
				ob, err := outbox.New(st, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ob.Handle("mail", func(ctx context.Context, ev outbox.Event) error {
					mu.Lock()
					calls[ev.ID] = append(calls[ev.ID], inst)
					mu.Unlock()
					if ev.ID == first && inst == "a" {
						<-hold // a's only worker is busy with the first event
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
			tx, err := outbox.BeginTx(ctx, base.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{first, second} {
				if _, err := a.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Mailed", JSON: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			waitRecord(t, base, first, "in a's handler", func(outbox.Record) bool {
				mu.Lock()
				defer mu.Unlock()
				return len(calls[first]) == 1
			})
			st.down.Store(true) // a's renewals fail from now on
			start("b")          // takes the second over once its lease ran out, and delivers it
			waitStatus(t, base, second, outbox.StatusDone)
			st.down.Store(false)
			hold <- struct{}{} // a's worker comes to the second event now
			waitStatus(t, base, first, outbox.StatusDone)
			a.Close(ctx) // every worker of a is done
			mu.Lock()
			defer mu.Unlock()
			if got := calls[second]; len(got) != 1 {
				t.Errorf("the second event was delivered by %v; want once (a's lease on it had run out when a's worker came to it)", got)
			}
		})
	}
}
