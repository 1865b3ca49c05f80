package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.Retirer.RetireSubscription.

// RetireSubscription refuses a subscription registered less than idle
// ago, and otherwise removes it from the registry (changing its version),
// drops its NEW and RETRY deliveries (its DEAD ones stay), and completes
// the split events left with nothing undone.
func testMethodRetire(t *testing.T, e *env) {
	rs, ok := e.store.(driver.Retirer)
	if !ok {
		t.Skip("the store does not implement driver.Retirer")
	}
	ctx := context.Background()
	ds := e.ds()
	reg, err := ds.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "keep"}, {Name: "gone"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := e.insertRows(t, 3, "me", minute)
	// ids[0]: gone owes it (NEW); ids[1]: gone retries it; ids[2]: gone
	// gave up (DEAD) and keep owes it.
	writes := [][]driver.DeliveryWrite{
		{{Subscription: "gone", Status: outbox.StatusNew}},
		{{Subscription: "gone", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "down"}},
		{{Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, Error: "gave up"}, {Subscription: "keep", Status: outbox.StatusNew}},
	}
	for i, w := range writes {
		if ok, err := splitOne(ctx, ds, "me", ids[i], w, reg.Version); err != nil || !ok {
			t.Fatalf("Split %d: %v %v", i, ok, err)
		}
	}
	if _, err := rs.RetireSubscription(ctx, "gone", time.Hour); !errors.Is(err, driver.ErrSubscriptionLive) {
		t.Fatalf("RetireSubscription of a subscription registered just now: %v; want ErrSubscriptionLive", err)
	}
	if rec := e.inspect(t, ids[0]); rec.Status != outbox.StatusSplit || len(rec.Deliveries) != 1 {
		t.Fatalf("after a refused retire: %v, %+v", rec.Status, rec.Deliveries)
	}
	r, err := rs.RetireSubscription(ctx, "gone", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Registered || r.Dropped != 2 || r.Completed != 2 {
		t.Errorf("RetireSubscription = %+v; want registered, 2 dropped, 2 completed", r)
	}
	for _, id := range ids[:2] {
		if rec := e.inspect(t, id); rec.Status != outbox.StatusDone {
			t.Errorf("event %s after the retire: %v; want DONE", id, rec.Status)
		}
	}
	rec := e.inspect(t, ids[2])
	if rec.Status != outbox.StatusSplit || len(rec.Deliveries) != 2 {
		t.Errorf("event with gone's dead delivery and keep's NEW one after the retire: %v %+v; want split, both kept", rec.Status, rec.Deliveries)
	}
	after, err := ds.SyncSubscriptions(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version == reg.Version {
		t.Errorf("registry version %d unchanged by the retire", after.Version)
	}
	for _, st := range after.Subscriptions {
		if st.Name == "gone" {
			t.Errorf("gone is still registered after the retire")
		}
	}
	if r, err := rs.RetireSubscription(ctx, "gone", 0); err != nil || r.Registered || r.Dropped != 0 {
		t.Errorf("a second retire = %+v, %v; want not registered, nothing dropped", r, err)
	}
}
