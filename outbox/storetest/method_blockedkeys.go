package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OrderedStore.BlockedKeys and SkipDead.

// A dead head blocks its key under Block, not under Skip; BlockedKeys
// names it; SkipDead unblocks it for good.
func testOrderDeadBlocks(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	dead, rest := e.deadHead(t, "k", 2)
	got, behind := claimHeadsBehind(t, os, "a", minute, blockS, "k")
	wantIDs(t, "ClaimHeads under Block behind a dead head", got, rest[0])
	wantBehind(t, "ClaimHeads under Block behind a dead head", behind, rest[0], "ord")
	if err := e.store.Release(ctx, "a", []string{rest[0]}, 0); err != nil {
		t.Fatal(err)
	}
	bs, err := os.BlockedKeys(ctx, blockS, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].Key != "k" || bs[0].Subscription != "" || bs[0].EventID != dead || bs[0].Type != string(typeA) || bs[0].Waiting != 2 || bs[0].Since.IsZero() {
		t.Fatalf("BlockedKeys = %+v; want k blocked by %s with 2 waiting", bs, dead)
	}
	if bs, err := os.BlockedKeys(ctx, skipS, "", 10); err != nil || len(bs) != 0 {
		t.Fatalf("BlockedKeys with no Block subscription = %+v, %v; want none", bs, err)
	}
	if n, err := os.SkipDead(ctx, []string{dead, rest[0], "no-such-id"}); err != nil || n != 1 {
		t.Fatalf("SkipDead = %d, %v; want 1", n, err)
	}
	rec := e.inspect(t, dead)
	if rec.Status != outbox.StatusDone || rec.LastError != "fatal" {
		t.Fatalf("a skipped event is %v with error %q; want DONE, its error kept", rec.Status, rec.LastError)
	}
	if bs, err := os.BlockedKeys(ctx, blockS, "", 10); err != nil || len(bs) != 0 {
		t.Fatalf("BlockedKeys after SkipDead = %+v, %v; want none", bs, err)
	}
	wantIDs(t, "ClaimHeads after SkipDead", claimHeads(t, os, "a", minute, blockS, "k"), rest[0])

	// Under Skip, the key goes on past a dead event.
	_, rest = e.deadHead(t, "s", 1)
	wantIDs(t, "ClaimHeads under Skip behind a dead head", claimHeads(t, os, "a", minute, skipS, "s"), rest[0])

	// A dead delivery of a Block subscription blocks; SkipDead gives it up
	// and the split event, with nothing else left, is done.
	first, next := e.splitHead(t, "d", driver.DeliveryWrite{Subscription: "blk", Status: outbox.StatusDead, Attempts: 3, Error: "fatal"})
	// (Key s is blocked under bothS too: its dead head is a whole DEAD
	// event, and bothS has a Block subscription.)
	bs, err = os.BlockedKeys(ctx, bothS, "c", 1)
	if err != nil || len(bs) != 1 || bs[0].Key != "d" || bs[0].Subscription != "blk" || bs[0].EventID != first || bs[0].Waiting != 1 {
		t.Fatalf("BlockedKeys = %+v, %v; want d blocked by its split event", bs, err)
	}
	if n, err := os.SkipDead(ctx, []string{first}); err != nil || n != 1 {
		t.Fatalf("SkipDead of a dead delivery = %d, %v; want 1", n, err)
	}
	if rec := e.inspect(t, first); rec.Status != outbox.StatusDone {
		t.Fatalf("a split event whose dead delivery was skipped is %v; want DONE", rec.Status)
	}
	wantIDs(t, "ClaimHeads after SkipDead of a delivery", claimHeads(t, os, "a", minute, bothS, "d"), next)
}

// BlockedKeys lists, in key order and page by page, the keys whose head is
// dead, with how many events wait behind it; a dead event behind a
// pending one does not block its key.
func testOrderBlockedKeys(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	// "a": e1 pending (replayed), e2 dead behind it: not blocked.
	a1, _ := e.pubOrdered(t, "a", "me", skipS)
	a2, _ := e.pubOrdered(t, "a", "", skipS)
	if ok, err := e.store.MarkDead(ctx, "me", a1, "fatal"); err != nil || !ok {
		t.Fatalf("MarkDead = %v, %v", ok, err)
	}
	wantIDs(t, "ClaimHeads under Skip", claimHeads(t, os, "me", minute, skipS, "a"), a2)
	if ok, err := e.store.MarkDead(ctx, "me", a2, "fatal"); err != nil || !ok {
		t.Fatalf("MarkDead = %v, %v", ok, err)
	}
	if n, err := dls.Replay(ctx, []string{a1}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	b, _ := e.deadHead(t, "b", 0)
	c, _ := e.deadHead(t, "c", 2)
	d, _ := e.deadHead(t, "d", 1)
	want := []driver.BlockedKey{{Key: "b", EventID: b}, {Key: "c", EventID: c, Waiting: 2}, {Key: "d", EventID: d, Waiting: 1}}
	var got []driver.BlockedKey
	after := ""
	for page := 0; ; page++ {
		bs, err := os.BlockedKeys(ctx, blockS, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, bs...)
		if len(bs) < 2 || page > 10 {
			break
		}
		after = bs[len(bs)-1].Key
	}
	if len(got) != len(want) {
		t.Fatalf("BlockedKeys, two at a time = %+v; want %+v", got, want)
	}
	for i, w := range want {
		g := got[i]
		if g.Key != w.Key || g.EventID != w.EventID || g.Waiting != w.Waiting || g.Type != string(typeA) || g.Since.IsZero() {
			t.Errorf("BlockedKeys[%d] = %+v; want %+v", i, g, w)
		}
	}
}

// BlockedKeys returns a full page while blocked keys remain, however many
// dead events that block nothing come before them.
func testOrderBlockedKeysFullPage(t *testing.T, e *env) {
	ctx := context.Background()
	st := e.ordered(t)
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	// Keys a1..a5: a pending (replayed) event with a dead one behind it.
	for i := range 5 {
		k := fmt.Sprintf("a%d", i)
		x1, _ := e.pubOrdered(t, k, "me", skipS)
		x2, _ := e.pubOrdered(t, k, "", skipS)
		if ok, err := e.store.MarkDead(ctx, "me", x1, "fatal"); err != nil || !ok {
			t.Fatalf("MarkDead = %v, %v", ok, err)
		}
		wantIDs(t, "ClaimHeads under Skip", claimHeads(t, st, "me", minute, skipS, k), x2)
		if ok, err := e.store.MarkDead(ctx, "me", x2, "fatal"); err != nil || !ok {
			t.Fatalf("MarkDead = %v, %v", ok, err)
		}
		if n, err := dls.Replay(ctx, []string{x1}); err != nil || n != 1 {
			t.Fatalf("Replay = %d, %v", n, err)
		}
	}
	b, _ := e.deadHead(t, "b", 0)
	bs, err := st.BlockedKeys(ctx, blockS, "", 1)
	if err != nil || len(bs) != 1 || bs[0].EventID != b {
		t.Fatalf("BlockedKeys(limit 1) = %+v, %v; want key b, blocked by %s", bs, err, b)
	}
}
