package storetest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.DeliveryStore.ClaimDeliveries.

// Two concurrent delivery claims never return the same delivery; a lease
// keeps others off until it runs out; then the previous owner is named.
func testMethodClaimDeliveries(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 40, "me", time.Minute)
	for _, id := range ids {
		if ok, err := splitOne(ctx, ds, "me", id, []driver.DeliveryWrite{{Subscription: "s", Status: outbox.StatusNew}, {Subscription: "other", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for _, owner := range []string{"x", "y"} {
		wg.Go(func() {
			for {
				got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 7, Lease: 250 * time.Millisecond}, []string{"s"}, driver.OrderFilter{})
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					if d.Subscription != "s" {
						t.Errorf("claimed a delivery to %q; asked for s only", d.Subscription)
					}
					if prev, dup := seen[d.ID]; dup {
						t.Errorf("delivery %s claimed by %s and %s", d.ID, prev, owner)
					}
					seen[d.ID] = owner
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != len(ids) {
		t.Fatalf("claimed %d deliveries; want %d", len(seen), len(ids))
	}
	// Leased: nothing more now; after the lease, taken over with the
	// previous owner named.
	if got, _ := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "z", Limit: 100, Lease: time.Minute}, []string{"s"}, driver.OrderFilter{}); len(got) != 0 {
		t.Fatalf("claimed %d leased deliveries", len(got))
	}
	time.Sleep(300 * time.Millisecond) // the lease is on the database's clock: nothing to wait on
	got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "z", Limit: 100, Lease: time.Minute}, []string{"s"}, driver.OrderFilter{})
	if err != nil || len(got) != len(ids) {
		t.Fatalf("after the leases ran out: %d, %v; want %d", len(got), err, len(ids))
	}
	for _, d := range got {
		if d.PrevOwner != seen[d.ID] {
			t.Fatalf("delivery %s: previous owner %q; want %q", d.ID, d.PrevOwner, seen[d.ID])
		}
	}
}

// A delivery to an ordered subscription is claimed in its turn: once the
// subscription delivered the earlier events of its key (a Skip
// subscription's dead delivery counts as delivered, a Block one's does
// not); an unordered subscription's deliveries are claimed at once.
func testOrderDeliveriesInTurn(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	ds := e.ds()
	req := driver.ClaimRequest{Owner: "c", Limit: noLimit, Lease: minute}
	claim := func(what string, sub string, want ...string) {
		t.Helper()
		got, err := ds.ClaimDeliveries(ctx, req, []string{sub}, bothS)
		if err != nil {
			t.Fatalf("%s: ClaimDeliveries: %v", what, err)
		}
		var ids []string
		for _, d := range got {
			ids = append(ids, d.ID)
		}
		slices.Sort(ids)
		wantIDs(t, what, ids, want...)
	}
	// key: its first event split with sub's delivery in first, its
	// second claimed as the head (sub behind) and split with sub's
	// delivery NEW.
	pair := func(key, sub string, first outbox.Status) (string, string) {
		t.Helper()
		one, two := e.splitHead(t, key, driver.DeliveryWrite{Subscription: sub, Status: first, Attempts: 1, Error: "boom"})
		wantIDs(t, key+": ClaimHeads", claimHeads(t, os, "me", minute, bothS, key), two)
		if ok, err := splitOne(ctx, ds, "me", two, []driver.DeliveryWrite{{Subscription: sub, Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("%s: Split = %v, %v", key, ok, err)
		}
		return one, two
	}
	one, two := pair("blk-retry", "blk", outbox.StatusRetry)
	claim("blk: the first retry, not the second in its key", "blk", one)
	claim("blk: nothing while the first is leased", "blk")
	if n, err := ds.CompleteDeliveries(ctx, "c", []driver.DeliveryID{{EventID: one, Subscription: "blk"}}); err != nil || n != 1 {
		t.Fatalf("CompleteDeliveries = %d, %v", n, err)
	}
	claim("blk: the second once the first was delivered", "blk", two)

	pair("blk-dead", "blk", outbox.StatusDead)
	claim("blk: nothing behind a dead delivery", "blk")

	_, two = pair("skp-dead", "skp", outbox.StatusDead)
	claim("skp: the second past a dead delivery", "skp", two)

	one, two = pair("plain-retry", "plain", outbox.StatusRetry)
	claim("plain: both at once", "plain", one, two)
}
