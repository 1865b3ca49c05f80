package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of the owner-checked writes of driver.DeliveryStore:
// CompleteDeliveries, FailDelivery, ExtendDeliveryLeases and
// ReleaseDeliveries.

// CompleteDeliveries, FailDelivery, ExtendDeliveryLeases and
// ReleaseDeliveries change only what the owner holds; the event is DONE
// when its last delivery is.
func testMethodDeliveryWrites(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	id := e.insertRows(t, 1, "me", time.Minute)[0]
	if ok, err := splitOne(ctx, ds, "me", id, []driver.DeliveryWrite{{Subscription: "a", Status: outbox.StatusNew}, {Subscription: "b", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	claim := func(owner string) []driver.Delivery {
		got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: time.Minute}, []string{"a", "b"}, driver.OrderFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claim("me"); len(got) != 2 {
		t.Fatalf("claimed %d; want 2", len(got))
	}
	ka, kb := driver.DeliveryID{EventID: id, Subscription: "a"}, driver.DeliveryID{EventID: id, Subscription: "b"}
	if n, err := ds.CompleteDeliveries(ctx, "intruder", []driver.DeliveryID{ka}); err != nil || n != 0 {
		t.Fatalf("CompleteDeliveries by a non-owner = %d, %v; want 0", n, err)
	}
	if n, err := ds.ExtendDeliveryLeases(ctx, "me", []driver.DeliveryID{ka, kb}, time.Minute); err != nil || n != 2 {
		t.Fatalf("ExtendDeliveryLeases = %d, %v; want 2", n, err)
	}
	if n, err := ds.CompleteDeliveries(ctx, "me", []driver.DeliveryID{ka}); err != nil || n != 1 {
		t.Fatalf("CompleteDeliveries(a) = %d, %v; want 1", n, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusSplit {
		t.Fatalf("event %v with b still owed; want split", rec.Status)
	}
	if ok, err := ds.FailDelivery(ctx, "intruder", kb, driver.DeliveryWrite{Status: outbox.StatusRetry, Attempts: 1, Error: "x"}); err != nil || ok {
		t.Fatalf("FailDelivery by a non-owner = %v, %v; want false", ok, err)
	}
	if ok, err := ds.FailDelivery(ctx, "me", kb, driver.DeliveryWrite{Status: outbox.StatusRetry, Attempts: 1, Error: "first"}); err != nil || !ok {
		t.Fatalf("FailDelivery = %v, %v", ok, err)
	}
	// Due at once (no delay): claim it again, defer it without an
	// attempt, and check the error is kept.
	if got := claim("me"); len(got) != 1 || got[0].Attempts != 1 || got[0].Status != outbox.StatusRetry {
		t.Fatalf("reclaimed %+v; want b at 1 attempt", got)
	}
	if ok, err := ds.FailDelivery(ctx, "me", kb, driver.DeliveryWrite{Status: outbox.StatusNew, Attempts: 1}); err != nil || !ok {
		t.Fatalf("defer = %v, %v", ok, err)
	}
	rec := e.inspect(t, id)
	if d := rec.Deliveries[1]; d.Subscription != "b" || d.Status != outbox.StatusNew || d.Attempts != 1 || d.LastError != "first" || len(d.History) != 1 {
		t.Fatalf("b after a deferral: %+v; want NEW, 1 attempt, last error kept, one attempt in the history", d)
	}
	if got := claim("me"); len(got) != 1 {
		t.Fatalf("reclaimed %d; want b", len(got))
	}
	if err := ds.ReleaseDeliveries(ctx, "nobody", []driver.DeliveryID{kb}, 0); err != nil {
		t.Fatal(err)
	}
	if got := claim("other"); len(got) != 0 {
		t.Fatal("a release by a non-owner freed the delivery")
	}
	if err := ds.ReleaseDeliveries(ctx, "me", []driver.DeliveryID{kb}, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := claim("me"); len(got) != 0 {
		t.Fatalf("claimed %d right after a release with a delay", len(got))
	}
	time.Sleep(250 * time.Millisecond) // the delay is on the database's clock: nothing to wait on
	if got := claim("me"); len(got) != 1 {
		t.Fatalf("claimed %d after the delay; want b", len(got))
	}
	if n, err := ds.CompleteDeliveries(ctx, "me", []driver.DeliveryID{kb}); err != nil || n != 1 {
		t.Fatalf("CompleteDeliveries(b) = %d, %v", n, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusDone {
		t.Fatalf("event %v after its last delivery; want DONE", rec.Status)
	}
}
