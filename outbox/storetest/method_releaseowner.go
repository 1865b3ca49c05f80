package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OwnerReleaser.ReleaseOwner.

// ReleaseOwner (driver.OwnerReleaser) gives up the owner's leases on its
// pending events and deliveries, and nothing else: not another owner's,
// not a delivered event's, not a row an open transaction is writing
// (which it does not wait for either).
func testMethodReleaseOwner(t *testing.T, e *env) {
	r, ok := e.store.(driver.OwnerReleaser)
	if !ok {
		t.Skip("the store does not implement driver.OwnerReleaser")
	}
	ctx := context.Background()
	mine := e.insertRows(t, 3, "me", time.Minute)
	others := e.insertRows(t, 2, "other", time.Minute)
	done := e.insertRows(t, 1, "me", time.Minute)
	if n, err := e.store.MarkDone(ctx, "me", done, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone: %d, %v", n, err)
	}
	split := splitClaimedByTwo(t, e)
	// A row leased to me in a transaction still open: not released, and
	// not waited for (where two writers can be open at once).
	open, uncommitted := openLeasedRow(t, e, "me")
	if open != nil {
		defer open.Rollback()
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := r.ReleaseOwner(rctx, "me")
	if err != nil {
		t.Fatalf("ReleaseOwner: %v", err)
	}
	if want := len(mine) + len(split); n != want {
		t.Errorf("ReleaseOwner = %d; want %d (%d events, %d deliveries)", n, want, len(mine), len(split))
	}
	for _, id := range mine {
		if rec := e.inspect(t, id); rec.Owner != "" || rec.Status != outbox.StatusNew || rec.Attempts != 0 {
			t.Errorf("event %s after ReleaseOwner: owner %q, status %v, attempts %d; want free, NEW, 0", id, rec.Owner, rec.Status, rec.Attempts)
		}
	}
	for _, id := range others {
		if rec := e.inspect(t, id); rec.Owner != "other" {
			t.Errorf("event %s leased to other: owner %q after ReleaseOwner(me)", id, rec.Owner)
		}
	}
	e.wantStatus(t, done[0], outbox.StatusDone)
	wantDeliveryOwners(t, e, split, map[string]string{"s": "", "t": "other"})
	// Free again: any instance claims them at once.
	if got, err := e.store.Claim(ctx, driver.ClaimRequest{Owner: "next", Limit: 10, Lease: time.Minute, SkipRecent: -1}); err != nil || len(got) != len(mine) {
		t.Errorf("a claim after ReleaseOwner took %d events (%v); want %d", len(got), err, len(mine))
	}
	if open != nil {
		if err := open.Commit(); err != nil {
			t.Fatal(err)
		}
		if rec := e.inspect(t, uncommitted); rec.Owner != "me" {
			t.Errorf("event %s, committed after ReleaseOwner(me): owner %q; want me", uncommitted, rec.Owner)
		}
	}
}

// splitClaimedByTwo writes two split events, each with a delivery to s
// claimed by "me" and one to t claimed by "other", and returns their ids.
func splitClaimedByTwo(t *testing.T, e *env) []string {
	t.Helper()
	ctx := context.Background()
	split := e.insertRows(t, 2, "setup", time.Minute)
	for _, id := range split {
		if ok, err := splitOne(ctx, e.ds(), "setup", id, []driver.DeliveryWrite{{Subscription: "s", Status: outbox.StatusNew}, {Subscription: "t", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	for owner, sub := range map[string]string{"me": "s", "other": "t"} {
		if got, err := e.ds().ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: time.Minute}, []string{sub}, driver.OrderFilter{}); err != nil || len(got) != len(split) {
			t.Fatalf("ClaimDeliveries(%s): %d, %v; want %d", owner, len(got), err, len(split))
		}
	}
	return split
}

// openLeasedRow inserts a row leased to owner in a transaction it leaves
// open, where the store allows two writers at once; else it returns nil.
func openLeasedRow(t *testing.T, e *env, owner string) (Tx, string) {
	t.Helper()
	if !e.h.ConcurrentWriters {
		return nil, ""
	}
	ctx := context.Background()
	open, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := outbox.NewID()
	row := driver.Row{ID: id, Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
	if err := e.store.Insert(ctx, open, &row, owner, time.Minute); err != nil {
		open.Rollback()
		t.Fatal(err)
	}
	return open, id
}

// wantDeliveryOwners checks the owner of each delivery of the events,
// by subscription.
func wantDeliveryOwners(t *testing.T, e *env, ids []string, want map[string]string) {
	t.Helper()
	for _, id := range ids {
		for _, d := range e.inspect(t, id).Deliveries {
			if d.Owner != want[d.Subscription] {
				t.Errorf("event %s, delivery to %s: owner %q after ReleaseOwner(me); want %q", id, d.Subscription, d.Owner, want[d.Subscription])
			}
		}
	}
}
