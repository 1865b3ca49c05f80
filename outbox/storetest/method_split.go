package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.DeliveryStore.Split.

// Split writes only for the owner; deliveries are due after their delay.
func testMethodSplit(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 1, "me", time.Minute)
	id := ids[0]
	writes := []driver.DeliveryWrite{
		{Subscription: "now", Status: outbox.StatusNew},
		{Subscription: "later", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "boom"},
		{Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, Error: "fatal"},
	}
	if ok, err := ds.Split(ctx, "someone-else", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("Split by a non-owner = %v, %v; want false", ok, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusNew || len(rec.Deliveries) != 0 {
		t.Fatalf("after a refused split: %v %+v", rec.Status, rec.Deliveries)
	}
	if ok, err := ds.Split(ctx, "me", id, writes, e.registry(t)); err != nil || !ok {
		t.Fatalf("Split by the owner = %v, %v; want true", ok, err)
	}
	rec := e.inspect(t, id)
	if rec.Status != outbox.StatusSplit || rec.Owner != "" || len(rec.Deliveries) != 3 {
		t.Fatalf("after split: status %v owner %q deliveries %+v", rec.Status, rec.Owner, rec.Deliveries)
	}
	want := map[string]outbox.DeliveryRecord{
		"now":   {Subscription: "now", Status: outbox.StatusNew},
		"later": {Subscription: "later", Status: outbox.StatusRetry, Attempts: 1, LastError: "boom"},
		"gone":  {Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, LastError: "fatal"},
	}
	for _, d := range rec.Deliveries {
		w := want[d.Subscription]
		if d.Status != w.Status || d.Attempts != w.Attempts || d.LastError != w.LastError || d.Owner != "" {
			t.Errorf("delivery %+v; want %+v", d, w)
		}
	}
	// Only the due one of the named subscriptions is claimed.
	got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "me", Limit: 10, Lease: time.Minute}, []string{"now", "later", "gone"}, driver.OrderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Subscription != "now" || got[0].ID != id || string(got[0].Payload) != payload || got[0].Attempts != 0 {
		t.Fatalf("ClaimDeliveries = %+v; want the due delivery to now with its event", got)
	}
	if ok, err := ds.Split(ctx, "me", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("a second Split = %v, %v; want false (the event is split already)", ok, err)
	}
}
