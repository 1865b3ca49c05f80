package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.DeliveryStore.DueNow.

// DueNow makes the unleased, deferred deliveries of one subscription due
// at once, and no other.
func testMethodDueNow(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 2, "me", time.Minute)
	for _, id := range ids {
		if ok, err := splitOne(ctx, ds, "me", id, []driver.DeliveryWrite{
			{Subscription: "down", Status: outbox.StatusNew, Delay: time.Hour},
			{Subscription: "other", Status: outbox.StatusNew, Delay: time.Hour},
		}, e.registry(t)); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	claim := func(sub string) int {
		got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "me", Limit: 10, Lease: time.Minute}, []string{sub}, driver.OrderFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	if n := claim("down"); n != 0 {
		t.Fatalf("claimed %d deferred deliveries before DueNow", n)
	}
	if n, err := ds.DueNow(ctx, "down"); err != nil || n != 2 {
		t.Fatalf("DueNow = %d, %v; want 2", n, err)
	}
	if n := claim("down"); n != 2 {
		t.Fatalf("claimed %d after DueNow; want 2", n)
	}
	if n := claim("other"); n != 0 {
		t.Fatalf("DueNow of one subscription made %d of another's due", n)
	}
	if n, err := ds.DueNow(ctx, "down"); err != nil || n != 0 {
		t.Fatalf("DueNow on leased deliveries = %d, %v; want 0", n, err)
	}
}
