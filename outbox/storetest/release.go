package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

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
	if n, err := e.store.MarkDone(ctx, "me", done); err != nil || n != 1 {
		t.Fatalf("MarkDone: %d, %v", n, err)
	}
	// Deliveries: split events, one delivery claimed by me, one by other.
	split := e.insertRows(t, 2, "setup", time.Minute)
	for _, id := range split {
		if ok, err := e.ds().Split(ctx, "setup", id, []driver.DeliveryWrite{{Subscription: "s", Status: outbox.StatusNew}, {Subscription: "t", Status: outbox.StatusNew}}); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	for owner, sub := range map[string]string{"me": "s", "other": "t"} {
		if got, err := e.ds().ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: time.Minute}, []string{sub}, driver.OrderFilter{}); err != nil || len(got) != len(split) {
			t.Fatalf("ClaimDeliveries(%s): %d, %v; want %d", owner, len(got), err, len(split))
		}
	}
	// A row leased to me in a transaction still open: not released, and
	// not waited for (where two writers can be open at once).
	var open Tx
	var uncommitted string
	if e.h.ConcurrentWriters {
		var err error
		if open, err = e.begin(ctx); err != nil {
			t.Fatal(err)
		}
		defer open.Rollback()
		uncommitted = outbox.NewID()
		row := driver.Row{ID: uncommitted, Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, open, &row, "me", time.Minute); err != nil {
			t.Fatal(err)
		}
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
	for _, id := range split {
		for _, d := range e.inspect(t, id).Deliveries {
			want := map[string]string{"s": "", "t": "other"}[d.Subscription]
			if d.Owner != want {
				t.Errorf("event %s, delivery to %s: owner %q after ReleaseOwner(me); want %q", id, d.Subscription, d.Owner, want)
			}
		}
	}
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
