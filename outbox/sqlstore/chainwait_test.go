package sqlstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// The events of a key waiting here behind one whose delivery does not
// finish (a handler stuck for longer than a lease) are given back within
// a lease instead of staying leased here for as long as it hangs (issue
// 33, defect 3: a run leased by a live instance and never attempted);
// once it finishes they are delivered in order, once each.
func TestChainWaitIsBoundedByALease(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			ctx := context.Background()
			const lease = time.Second
			hold := make(chan struct{})
			var mu sync.Mutex
			var got []string
			first := outbox.NewID()
			ob := startOrdered(t, st, outbox.Config{InstanceID: "a", Lease: lease, PollInterval: 50 * time.Millisecond},
				outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Timeout: time.Minute, Handler: func(ctx context.Context, ev outbox.Event) error {
					if ev.ID == first {
						<-hold
					}
					mu.Lock()
					got = append(got, ev.ID)
					mu.Unlock()
					return nil
				}})
			defer close(hold)
			tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{first}
			for i := range 3 {
				id := first
				if i > 0 {
					id = outbox.NewID()
					ids = append(ids, id)
				}
				if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Posted", AggregateType: "Account", AggregateID: "A", JSON: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			waitRecord(t, st, ids[1], "waiting here behind the first", func(rec outbox.Record) bool { return rec.Owner == "a" })
			for _, id := range ids[1:] {
				waitRecord(t, st, id, "given back while the first hangs", func(rec outbox.Record) bool { return rec.Owner == "" })
			}
			mu.Lock()
			early := slices.Clone(got)
			mu.Unlock()
			if len(early) != 0 {
				t.Fatalf("delivered %v while the first event of the key hangs", early)
			}
			hold <- struct{}{}
			for _, id := range ids {
				waitStatus(t, st, id, outbox.StatusDone)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(got, ids) {
				t.Errorf("delivered %v; want %v, in order, once each", got, ids)
			}
		})
	}
}
