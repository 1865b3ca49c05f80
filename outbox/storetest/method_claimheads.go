package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OrderedStore.ClaimHeads.

// ClaimHeads leases only a key's head, and only when it is NEW or RETRY,
// due and not held by a live lease.
func testOrderClaimHeads(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	var k []string
	for range 3 {
		id, _ := e.pubOrdered(t, "k", "", blockS)
		k = append(k, id)
	}
	wantIDs(t, "ClaimHeads(a)", claimHeads(t, os, "a", minute, blockS, "k", "none"), k[0])
	wantIDs(t, "ClaimHeads(b) while a holds the head", claimHeads(t, os, "b", minute, blockS, "k"))
	wantIDs(t, "ClaimHeads(a) while a holds the head", claimHeads(t, os, "a", minute, blockS, "k"))
	// A retry due later holds the key: its successor is not the head.
	if ok, err := e.store.MarkRetry(ctx, "a", k[0], time.Hour, "boom"); err != nil || !ok {
		t.Fatalf("MarkRetry = %v, %v", ok, err)
	}
	wantIDs(t, "ClaimHeads with the head due in an hour", claimHeads(t, os, "b", minute, blockS, "k"))
	wantIDs(t, "ClaimHeads with no ordered subscription", claimHeads(t, os, "b", minute, driver.OrderFilter{}, "k"))

	// A lease that ran out lets another take the head; delivered, the
	// next one is the head.
	var m []string
	for range 2 {
		id, _ := e.pubOrdered(t, "m", "", blockS)
		m = append(m, id)
	}
	wantIDs(t, "ClaimHeads(a, no lease)", claimHeads(t, os, "a", 0, blockS, "m"), m[0])
	wantIDs(t, "ClaimHeads(b) after a's lease ran out", claimHeads(t, os, "b", minute, blockS, "m"), m[0])
	if n, err := e.store.MarkDone(ctx, "a", []string{m[0]}, e.registry(t)); err != nil || n != 0 {
		t.Fatalf("MarkDone by the previous owner = %d, %v; want 0", n, err)
	}
	if n, err := e.store.MarkDone(ctx, "b", []string{m[0]}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	wantIDs(t, "ClaimHeads after the head was delivered", claimHeads(t, os, "a", minute, blockS, "m"), m[1])

	// A head handed back for later is not due; the key waits.
	n1, _ := e.pubOrdered(t, "n", "me", blockS)
	e.pubOrdered(t, "n", "me", blockS)
	if err := e.store.Release(ctx, "me", []string{n1}, time.Hour); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "ClaimHeads with the head handed back for an hour", claimHeads(t, os, "a", minute, blockS, "n"))

	// At most Limit heads are leased, passing over the keys held
	// elsewhere.
	var l []string
	for _, key := range []string{"l1", "l2", "l3", "l4"} {
		id, _ := e.pubOrdered(t, key, "", blockS)
		l = append(l, id)
	}
	wantIDs(t, "ClaimHeads(b, l1)", claimHeads(t, os, "b", minute, blockS, "l1"), l[0])
	rows, err := os.ClaimHeads(ctx, driver.ClaimRequest{Owner: "a", Limit: 2, Lease: minute}, []string{"l1", "l2", "l3", "l4"}, blockS)
	if err != nil || len(rows) != 2 || rows[0].OrderingKey == "l1" || rows[1].OrderingKey == "l1" {
		t.Fatalf("ClaimHeads(Limit 2) with l1 held elsewhere = %v, %v; want the heads of 2 of l2, l3, l4", rowKeys(rows), err)
	}

	// The unordered Claim never takes an ordered event.
	plain := driver.Row{ID: outbox.NewID(), Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: "l3"}
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Insert(ctx, tx, &plain, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got, err := e.store.Claim(ctx, driver.ClaimRequest{Owner: "c", Limit: noLimit, Lease: minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != plain.ID {
		t.Fatalf("Claim = %d rows; want only the unordered event", len(got))
	}
}

// A split event holds its key, for the subscription it owes, while a
// delivery of a Block subscription is not done, or one of a Skip
// subscription is NEW or RETRY; a delivery of an unordered subscription
// holds nothing back. The next event is claimed all the same, naming the
// subscription that is behind; it is not the head on the hot path.
func testOrderSplitHolds(t *testing.T, e *env) {
	os := e.ordered(t)
	later := func(sub string, st outbox.Status) driver.DeliveryWrite {
		return driver.DeliveryWrite{Subscription: sub, Status: st, Attempts: 1, Delay: time.Hour, Error: "boom"}
	}
	for _, c := range []struct {
		name  string
		write driver.DeliveryWrite
		holds bool
	}{
		{"block-retry", later("blk", outbox.StatusRetry), true},
		{"block-new", later("blk", outbox.StatusNew), true},
		{"block-dead", later("blk", outbox.StatusDead), true},
		{"skip-retry", later("skp", outbox.StatusRetry), true},
		{"skip-dead", later("skp", outbox.StatusDead), false},
		{"unordered-retry", later("plain", outbox.StatusRetry), false},
		{"unordered-dead", later("plain", outbox.StatusDead), false},
	} {
		_, next := e.splitHead(t, c.name, c.write)
		what := "ClaimHeads behind a split event with a " + c.name + " delivery"
		got, behind := claimHeadsBehind(t, os, "a", minute, bothS, c.name)
		wantIDs(t, what, got, next)
		if c.holds {
			wantBehind(t, what, behind, next, c.write.Subscription)
			if _, head := e.pubOrdered(t, c.name, "me", bothS); head {
				t.Errorf("%s: a new event is reported the head behind a held split event", c.name)
			}
		} else {
			wantBehind(t, what, behind, next)
		}
	}
}

// With OrderFilter.Every (no subscription is unordered), a head that
// every subscription is behind on is left unleased, with its run: a
// claim would only record it deferred for all of them. Once one of them
// is not behind, or without Every, it is leased.
func testOrderAllBehind(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	every := driver.OrderFilter{Block: []string{"blk"}, Skip: []string{"skp"}, Every: true}
	owe := func(sub string) driver.DeliveryWrite {
		return driver.DeliveryWrite{Subscription: sub, Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "boom"}
	}
	_, next := e.splitHead(t, "all", owe("blk"), owe("skp"))
	e.pubOrdered(t, "all", "", bothS)
	req := driver.ClaimRequest{Owner: "a", Limit: 1, Lease: minute, Run: 10}
	if rows, err := os.ClaimHeads(ctx, req, []string{"all"}, every); err != nil || len(rows) != 0 {
		t.Fatalf("ClaimHeads(Every) with both subscriptions behind = %v, %v; want none leased", rowKeys(rows), err)
	}
	_, next2 := e.splitHead(t, "one", owe("blk"))
	got, behind := claimHeadsBehind(t, os, "a", minute, every, "one")
	wantIDs(t, "ClaimHeads(Every) with one subscription of two behind", got, next2)
	wantBehind(t, "ClaimHeads(Every) with one subscription of two behind", behind, next2, "blk")
	got, behind = claimHeadsBehind(t, os, "a", minute, bothS, "all")
	wantIDs(t, "ClaimHeads without Every, both behind", got, next)
	wantBehind(t, "ClaimHeads without Every, both behind", behind, next, "blk", "skp")
}

// A replayed dead head is the head again, before the events that waited.
func testOrderReplayDeadHead(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	dead, rest := e.deadHead(t, "k", 2)
	if n, err := dls.Replay(ctx, []string{dead}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	wantIDs(t, "ClaimHeads after Replay", claimHeads(t, os, "a", minute, blockS, "k"), dead)
	if n, err := e.store.MarkDone(ctx, "a", []string{dead}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	wantIDs(t, "ClaimHeads after the replayed head was delivered", claimHeads(t, os, "a", minute, blockS, "k"), rest[0])
}

// At most one event of a key is leased (driver.OrderedStore): under
// OrderedSkipDead, replaying a dead event while a later event of its key
// is leased must not lease the replayed one too.
func testOrderReplayWhileLaterLeased(t *testing.T, e *env) {
	ctx := context.Background()
	st := e.ordered(t)
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	dead, rest := e.deadHead(t, "k", 1)
	wantIDs(t, "ClaimHeads under Skip behind a dead head", claimHeads(t, st, "a", minute, skipS, "k"), rest[0])
	if n, err := dls.Replay(ctx, []string{dead}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	wantIDs(t, "ClaimHeads while a later event of the key is leased", claimHeads(t, st, "b", minute, skipS, "k"))
}
