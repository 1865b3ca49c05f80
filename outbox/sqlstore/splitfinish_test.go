package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Two instances that write the last two deliveries of a split event at
// the same moment complete the event, in every completion mode. Before
// the event's row was locked first (finishSplit), each transaction read
// the other's delivery as still to do (at READ COMMITTED a statement sees
// only what was committed when it began) and neither completed it: the
// event stayed split for good, neither DONE nor archived.
func TestLastDeliveriesWrittenAtOnceCompleteTheEvent(t *testing.T) {
	const events = 200
	for _, name := range testdb.Names {
		for _, mode := range []struct {
			name string
			opts sqlstore.Options
		}{{"keep", sqlstore.Options{}}, {"archive", sqlstore.Options{ArchiveDelivered: true}}} {
			t.Run(name+"/"+mode.name, func(t *testing.T) {
				db := testdb.Open(t, name)
				st := testdb.StoreWith(t, db, mode.opts)
				ctx := context.Background()
				reg, err := st.SyncSubscriptions(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				ids := insertLeased(t, st, "me", make([]driver.Row, events)...)
				for _, id := range ids {
					writes := []driver.DeliveryWrite{{Subscription: "s1", Status: outbox.StatusNew}, {Subscription: "s2", Status: outbox.StatusNew}}
					if ok, err := splitOne(ctx, st, "me", id, writes, reg.Version); err != nil || !ok {
						t.Fatalf("Split = %v, %v", ok, err)
					}
				}
				for _, c := range []struct{ owner, sub string }{{"a", "s1"}, {"b", "s2"}} {
					got, err := st.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: c.owner, Limit: events, Lease: time.Minute}, []string{c.sub}, driver.OrderFilter{})
					if err != nil || len(got) != events {
						t.Fatalf("%s claims %d deliveries to %s, %v; want %d", c.owner, len(got), c.sub, err, events)
					}
				}
				// For each event, a and b write their deliveries at once.
				for _, id := range ids {
					start := make(chan struct{})
					var wg sync.WaitGroup
					for _, c := range []struct{ owner, sub string }{{"a", "s1"}, {"b", "s2"}} {
						wg.Go(func() {
							<-start
							if n, err := st.CompleteDeliveries(ctx, c.owner, []driver.DeliveryID{{EventID: id, Subscription: c.sub}}); err != nil || n != 1 {
								t.Errorf("CompleteDeliveries by %s = %d, %v; want 1", c.owner, n, err)
							}
						})
					}
					close(start)
					wg.Wait()
				}
				stuck := 0
				for _, id := range ids {
					rec, err := st.Inspect(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					if rec.Status != outbox.StatusDone || (mode.opts.ArchiveDelivered && !rec.Archived()) {
						stuck++
					}
				}
				if stuck > 0 {
					t.Errorf("%d of %d events whose every delivery was written DONE are not complete (status split)", stuck, events)
				}
			})
		}
	}
}
