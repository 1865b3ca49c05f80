package storetest

import (
	"context"
	"errors"
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
	if ok, err := splitOne(ctx, ds, "someone-else", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("Split by a non-owner = %v, %v; want false", ok, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusNew || len(rec.Deliveries) != 0 {
		t.Fatalf("after a refused split: %v %+v", rec.Status, rec.Deliveries)
	}
	if ok, err := splitOne(ctx, ds, "me", id, writes, e.registry(t)); err != nil || !ok {
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
	if ok, err := splitOne(ctx, ds, "me", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("a second Split = %v, %v; want false (the event is split already)", ok, err)
	}
}

// Split of many events at once: it writes those owner holds, in order,
// with all of their deliveries (more than one INSERT's worth), and leaves
// the others as they were; with another registry version it writes
// nothing.
func testMethodSplitMany(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	mine := e.insertRows(t, 600, "me", time.Minute)
	theirs := e.insertRows(t, 1, "someone-else", time.Minute)[0]
	free := e.insertRows(t, 1, "", 0)[0]
	var splits []driver.EventSplit
	for i, id := range mine {
		if i == 300 {
			splits = append(splits, driver.EventSplit{EventID: theirs, Writes: []driver.DeliveryWrite{{Subscription: "a", Status: outbox.StatusNew}}})
			splits = append(splits, driver.EventSplit{EventID: free, Writes: []driver.DeliveryWrite{{Subscription: "a", Status: outbox.StatusNew}}})
		}
		splits = append(splits, driver.EventSplit{EventID: id, Writes: []driver.DeliveryWrite{
			{Subscription: "a", Status: outbox.StatusNew},
			{Subscription: "b", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "boom"},
		}})
	}
	v := e.registry(t)
	if held, err := ds.Split(ctx, "me", splits, v+1); !errors.Is(err, driver.ErrRegistryChanged) || held != nil {
		t.Fatalf("Split with another registry version = %v, %v; want nil, ErrRegistryChanged", held, err)
	}
	if rec := e.inspect(t, mine[599]); rec.Status != outbox.StatusNew || rec.Owner != "me" || len(rec.Deliveries) != 0 {
		t.Fatalf("after a refused Split: status %v owner %q deliveries %+v", rec.Status, rec.Owner, rec.Deliveries)
	}
	held, err := ds.Split(ctx, "me", splits, v)
	if err != nil || len(held) != len(splits) {
		t.Fatalf("Split of %d events = %d results, %v", len(splits), len(held), err)
	}
	for i, sp := range splits {
		if want := sp.EventID != theirs && sp.EventID != free; held[i] != want {
			t.Fatalf("held[%d] (%s) = %v; want %v", i, sp.EventID, held[i], want)
		}
	}
	for id, owner := range map[string]string{theirs: "someone-else", free: ""} {
		if rec := e.inspect(t, id); rec.Status != outbox.StatusNew || rec.Owner != owner || len(rec.Deliveries) != 0 {
			t.Fatalf("an event not held: status %v owner %q deliveries %+v; want it as it was", rec.Status, rec.Owner, rec.Deliveries)
		}
	}
	for _, id := range []string{mine[0], mine[300], mine[599]} {
		rec := e.inspect(t, id)
		if rec.Status != outbox.StatusSplit || rec.Owner != "" || len(rec.Deliveries) != 2 {
			t.Fatalf("a split event: status %v owner %q deliveries %+v", rec.Status, rec.Owner, rec.Deliveries)
		}
	}
	got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "me", Limit: 1000, Lease: time.Minute}, []string{"a", "b"}, driver.OrderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, d := range got {
		if d.Subscription != "a" {
			t.Fatalf("claimed %+v: the deliveries to b are not due", d)
		}
		seen[d.ID] = true
	}
	if len(got) != len(mine) || len(seen) != len(mine) {
		t.Fatalf("claimed %d deliveries to a (%d events); want one for each of the %d events split", len(got), len(seen), len(mine))
	}
}
