package outbox_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// The events of a key that wait here behind one whose delivery does not
// finish (a handler stuck for longer than a lease) are given back within
// a lease, to wait in the table, instead of staying leased here for as
// long as it hangs (issue 33, defect 3); once it finishes they are
// delivered in order, once each.
func TestChainWaitIsBoundedByALease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := outboxtest.NewStore()
		const lease = time.Second
		ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Logger: slog.New(slog.DiscardHandler), Lease: lease, PollInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{outbox.NewID(), outbox.NewID(), outbox.NewID()}
		hold := make(chan struct{})
		var mu sync.Mutex
		var got []string
		if err := ob.Subscribe(outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Timeout: time.Minute, Handler: func(ctx context.Context, ev outbox.Event) error {
			if ev.ID == ids[0] {
				<-hold
			}
			mu.Lock()
			got = append(got, ev.ID)
			mu.Unlock()
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ob.Close(ctx)
		tx := st.Begin(ctx)
		for _, id := range ids {
			if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Posted", AggregateType: "Account", AggregateID: "A", JSON: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		owner := func(id string) string {
			rec, err := st.Inspect(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return rec.Owner
		}
		if owner(ids[1]) != "a" {
			t.Fatalf("the second event is not waiting here behind the first (owner %q): the test needs the chain", owner(ids[1]))
		}
		time.Sleep(2 * lease)
		for _, id := range ids[1:] {
			if o := owner(id); o != "" {
				t.Errorf("%s is still leased to %q two leases after it began to wait behind a delivery that has not finished; want given back", id, o)
			}
		}
		close(hold)
		time.Sleep(5 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(got, ids) {
			t.Errorf("delivered %v; want %v, in order, once each", got, ids)
		}
	})
}
