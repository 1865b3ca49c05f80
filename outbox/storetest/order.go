package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The ordering cases (driver.OrderedStore), method by method. They run
// only for stores that order events by key.

var (
	blockS  = driver.OrderFilter{Block: []string{"ord"}}
	skipS   = driver.OrderFilter{Skip: []string{"ord"}}
	bothS   = driver.OrderFilter{Block: []string{"blk"}, Skip: []string{"skp"}}
	minute  = time.Minute
	noLimit = 100
)

func (e *env) ordered(t *testing.T) driver.OrderedStore {
	t.Helper()
	os, ok := e.store.(driver.OrderedStore)
	if !ok {
		t.Skip("the store is not a driver.OrderedStore")
	}
	return os
}

// pubOrdered writes one ordered event of key in a transaction of its
// own, leased to owner if it is the key's head, and returns its id and
// whether it was.
func (e *env) pubOrdered(t *testing.T, key, owner string, f driver.OrderFilter) (string, bool) {
	t.Helper()
	ids, heads := e.pubOrderedTx(t, owner, f, key)
	return ids[0], heads[0]
}

// pubOrderedTx writes one ordered event per key, in one transaction.
func (e *env) pubOrderedTx(t *testing.T, owner string, f driver.OrderFilter, keys ...string) ([]string, []bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	var heads []bool
	for _, k := range keys {
		r := driver.Row{ID: outbox.NewID(), Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: k}
		head, _, err := e.store.(driver.OrderedStore).InsertOrdered(ctx, tx, &r, owner, minute, f)
		if err != nil {
			tx.Rollback()
			t.Fatalf("InsertOrdered: %v", err)
		}
		ids, heads = append(ids, r.ID), append(heads, head)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids, heads
}

// claimHeads returns the ids ClaimHeads leased to owner.
func claimHeads(t *testing.T, os driver.OrderedStore, owner string, lease time.Duration, f driver.OrderFilter, keys ...string) []string {
	t.Helper()
	ids, _ := claimHeadsBehind(t, os, owner, lease, f, keys...)
	return ids
}

// claimHeadsBehind returns the ids ClaimHeads leased to owner, and the
// rows' Behind by id.
func claimHeadsBehind(t *testing.T, os driver.OrderedStore, owner string, lease time.Duration, f driver.OrderFilter, keys ...string) ([]string, map[string][]string) {
	t.Helper()
	rows, err := os.ClaimHeads(context.Background(), driver.ClaimRequest{Owner: owner, Limit: noLimit, Lease: lease}, keys, f)
	if err != nil {
		t.Fatalf("ClaimHeads: %v", err)
	}
	var ids []string
	behind := map[string][]string{}
	for _, r := range rows {
		if r.OrderingKey == "" || r.KeySeq == 0 {
			t.Errorf("ClaimHeads returned %s with key %q, number %d: want both set", r.ID, r.OrderingKey, r.KeySeq)
		}
		ids = append(ids, r.ID)
		behind[r.ID] = r.Behind
	}
	slices.Sort(ids)
	return ids, behind
}

// wantBehind checks the Behind of row id as ClaimHeads returned it.
func wantBehind(t *testing.T, what string, behind map[string][]string, id string, want ...string) {
	t.Helper()
	if got := behind[id]; !slices.Equal(got, want) {
		t.Fatalf("%s: Behind = %v; want %v", what, got, want)
	}
}

func wantIDs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v; want %v", what, got, want)
	}
}

// Every event of a key gets the next number of the key's sequence, key by
// key, in separate transactions and in one; an event written by the
// unordered Insert has none.
func testOrderNumbering(t *testing.T, e *env) {
	e.ordered(t)
	var ids []string
	for range 3 {
		id, _ := e.pubOrdered(t, "k1", "", blockS)
		ids = append(ids, id)
	}
	more, _ := e.pubOrderedTx(t, "", blockS, "k2", "k1", "k2")
	want := map[string]int64{ids[0]: 1, ids[1]: 2, ids[2]: 3, more[0]: 1, more[1]: 4, more[2]: 2}
	for id, n := range want {
		rec := e.inspect(t, id)
		if rec.KeySeq != n {
			t.Errorf("event %s of key %s has number %d; want %d", id, rec.OrderingKey, rec.KeySeq, n)
		}
	}
	plain := e.insertRows(t, 1, "", 0)[0]
	if rec := e.inspect(t, plain); rec.KeySeq != 0 {
		t.Errorf("an event written by Insert has number %d; want none", rec.KeySeq)
	}
}

// The head goes to its owner only when nothing earlier of its key is
// pending; the others are written free.
func testOrderHeadLeasedToOwner(t *testing.T, e *env) {
	ctx := context.Background()
	e.ordered(t)
	e1, head := e.pubOrdered(t, "k", "me", blockS)
	if !head {
		t.Fatal("the first event of a key is not its head")
	}
	if rec := e.inspect(t, e1); rec.Owner != "me" {
		t.Fatalf("the head is held by %q; want me", rec.Owner)
	}
	e2, head := e.pubOrdered(t, "k", "me", blockS)
	if head {
		t.Fatal("an event behind a pending one is reported the head")
	}
	if rec := e.inspect(t, e2); rec.Owner != "" || rec.Status != outbox.StatusNew {
		t.Fatalf("an event behind a pending one is %v held by %q; want NEW and free", rec.Status, rec.Owner)
	}
	// e1 delivered: e2 is pending still, so e3 is not the head either.
	kd1, kd2 := keyDone(t, e, e1), keyDone(t, e, e2)
	if n, err := e.store.MarkDone(ctx, "me", []string{e1}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	keysDone(t, e, blockS, kd1, kd2)
	if _, head := e.pubOrdered(t, "k", "me", blockS); head {
		t.Fatal("an event behind a pending one is reported the head")
	}
	// Once the engine has recorded a key's last event as delivered, the
	// next one is the head.
	a1, _ := e.pubOrdered(t, "k2", "me", blockS)
	kda := keyDone(t, e, a1)
	if n, err := e.store.MarkDone(ctx, "me", []string{a1}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	keysDone(t, e, blockS, kda)
	if _, head := e.pubOrdered(t, "k2", "me", blockS); !head {
		t.Fatal("the event after a delivered one (KeysDone) is not the head")
	}
	// Another key is not held back; an event with no owner is free.
	o1, head := e.pubOrdered(t, "other", "", blockS)
	if rec := e.inspect(t, o1); rec.Owner != "" {
		t.Fatalf("an event written for owner \"\" is held by %q (head %v)", rec.Owner, head)
	}
	if _, head := e.pubOrdered(t, "third", "me", blockS); !head {
		t.Fatal("the first event of a new key is not its head")
	}
	// A dead event is pending under Block only.
	d1, _ := e.pubOrdered(t, "dead", "me", blockS)
	if ok, err := e.store.MarkDead(ctx, "me", d1, "fatal"); err != nil || !ok {
		t.Fatalf("MarkDead = %v, %v", ok, err)
	}
	keysDone(t, e, blockS, keyDone(t, e, d1))
	if _, head := e.pubOrdered(t, "dead", "me", blockS); head {
		t.Fatal("under Block, an event behind a dead one is reported the head")
	}
	d3, head := e.pubOrdered(t, "dead2", "me", skipS)
	if ok, err := e.store.MarkDead(ctx, "me", d3, "fatal"); err != nil || !ok || !head {
		t.Fatalf("MarkDead = %v, %v (head %v)", ok, err, head)
	}
	keysDone(t, e, skipS, keyDone(t, e, d3))
	if _, head := e.pubOrdered(t, "dead2", "me", skipS); !head {
		t.Fatal("under Skip, an event behind a dead one is not the head")
	}
}

// pubAfter writes one ordered event of key in a transaction of its own,
// for owner, with Row.KeyAfter set to after, and returns its id, number,
// and what InsertOrdered reported.
func (e *env) pubAfter(t *testing.T, key, owner string, after int64) (id string, seq int64, head, leased bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := driver.Row{ID: outbox.NewID(), Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: key, KeyAfter: after}
	head, leased, err = e.store.(driver.OrderedStore).InsertOrdered(ctx, tx, &r, owner, minute, blockS)
	if err != nil {
		tx.Rollback()
		t.Fatalf("InsertOrdered: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return r.ID, r.KeySeq, head, leased
}

// An event numbered Row.KeyAfter+1 is written leased to its owner though
// it is not its key's head (the owner holds the one before it); any other
// number is not, nor an event written for no owner.
func testOrderLeasedAfterOwnersEvent(t *testing.T, e *env) {
	e.ordered(t)
	e1, s1, head, leased := e.pubAfter(t, "k", "me", 0)
	if !head || !leased || s1 != 1 {
		t.Fatalf("the first event of a key: number %d, head %v, leased %v; want 1, true, true", s1, head, leased)
	}
	e2, s2, head, leased := e.pubAfter(t, "k", "me", s1)
	if head || !leased || s2 != 2 {
		t.Fatalf("the event after one its owner holds: number %d, head %v, leased %v; want 2, false, true", s2, head, leased)
	}
	for _, id := range []string{e1, e2} {
		if rec := e.inspect(t, id); rec.Owner != "me" || rec.Status != outbox.StatusNew {
			t.Fatalf("event %s is %v held by %q; want NEW held by me", id, rec.Status, rec.Owner)
		}
	}
	e3, s3, head, leased := e.pubAfter(t, "k", "me", s1) // two behind
	if head || leased || s3 != 3 {
		t.Fatalf("an event two after the one named: number %d, head %v, leased %v; want 3, false, false", s3, head, leased)
	}
	if rec := e.inspect(t, e3); rec.Owner != "" {
		t.Fatalf("an event two after the one named is held by %q; want free", rec.Owner)
	}
	e4, s4, _, leased := e.pubAfter(t, "k", "", s3)
	if leased || s4 != 4 {
		t.Fatalf("an event for no owner: number %d, leased %v; want 4, false", s4, leased)
	}
	if rec := e.inspect(t, e4); rec.Owner != "" {
		t.Fatalf("an event written for no owner is held by %q", rec.Owner)
	}
	// Only heads are claimed: not e3, behind e1 and e2.
	if got := claimHeads(t, e.store.(driver.OrderedStore), "other", minute, blockS, "k"); len(got) != 0 {
		t.Fatalf("ClaimHeads took %v while the key's first events are leased", got)
	}
}

// MarkDoneKeys reports the keys whose later events wait in the table:
// those with events numbered after the ones it recorded, not the others;
// and every key when a lease was lost.
func testOrderMarkDoneKeysLater(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	a1, _ := e.pubOrdered(t, "a", "me", blockS)
	b1, _ := e.pubOrdered(t, "b", "me", blockS)
	e.pubOrdered(t, "a", "me", blockS) // a2 waits behind a1
	kda, kdb := keyDone(t, e, a1), keyDone(t, e, b1)
	n, later, err := os.MarkDoneKeys(ctx, "me", []string{a1, b1}, []driver.KeyDone{kda, kdb}, e.registry(t))
	if err != nil || n != 2 {
		t.Fatalf("MarkDoneKeys = %d, %v", n, err)
	}
	wantIDs(t, "MarkDoneKeys' later keys", later, "a")
	if _, head := e.pubOrdered(t, "b", "me", blockS); !head {
		t.Fatal("the event after one MarkDoneKeys recorded is not the head")
	}
	// A lease lost: every key, since which events are done is not known.
	c1, _ := e.pubOrdered(t, "c", "me", blockS)
	d1, _ := e.pubOrdered(t, "d", "other", blockS)
	n, later, err = os.MarkDoneKeys(ctx, "me", []string{c1, d1}, []driver.KeyDone{keyDone(t, e, c1), keyDone(t, e, d1)}, e.registry(t))
	if err != nil || n != 1 {
		t.Fatalf("MarkDoneKeys with one lease not ours = %d, %v; want 1", n, err)
	}
	wantIDs(t, "MarkDoneKeys' later keys after a lost lease", later, "c", "d")
}

// keyDone names a stored ordered event for KeysDone (read before its
// outcome is recorded: a store may delete it then).
func keyDone(t *testing.T, e *env, id string) driver.KeyDone {
	t.Helper()
	rec := e.inspect(t, id)
	return driver.KeyDone{EventID: id, Key: rec.OrderingKey, Seq: rec.KeySeq}
}

// keysDone tells the store that evs finished (as the engine does after
// recording their outcome).
func keysDone(t *testing.T, e *env, f driver.OrderFilter, evs ...driver.KeyDone) {
	t.Helper()
	if err := e.store.(driver.OrderedStore).KeysDone(context.Background(), evs, f); err != nil {
		t.Fatalf("KeysDone: %v", err)
	}
}

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

	// At most Limit keys are looked at.
	for _, key := range []string{"l1", "l2", "l3"} {
		e.pubOrdered(t, key, "", blockS)
	}
	rows, err := os.ClaimHeads(ctx, driver.ClaimRequest{Owner: "a", Limit: 2, Lease: minute}, []string{"l1", "l2", "l3"}, blockS)
	if err != nil || len(rows) != 2 {
		t.Fatalf("ClaimHeads(Limit 2) = %d rows, %v; want 2", len(rows), err)
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

// splitHead leases key's first event, which must be the only one before
// next, and splits it with writes.
func (e *env) splitHead(t *testing.T, key string, writes ...driver.DeliveryWrite) (first, next string) {
	t.Helper()
	first, _ = e.pubOrdered(t, key, "me", bothS)
	next, _ = e.pubOrdered(t, key, "", bothS)
	if ok, err := e.ds().Split(context.Background(), "me", first, writes, e.registry(t)); err != nil || !ok {
		t.Fatalf("Split = %v, %v", ok, err)
	}
	return first, next
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

// deadHead makes key's first event dead and writes n more behind it.
func (e *env) deadHead(t *testing.T, key string, n int) (dead string, rest []string) {
	t.Helper()
	dead, _ = e.pubOrdered(t, key, "me", blockS)
	for range n {
		id, _ := e.pubOrdered(t, key, "me", blockS)
		rest = append(rest, id)
	}
	if ok, err := e.store.MarkDead(context.Background(), "me", dead, "fatal"); err != nil || !ok {
		t.Fatalf("MarkDead = %v, %v", ok, err)
	}
	return dead, rest
}

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

// DueKeys pages through the keys with due, free, NEW or RETRY ordered
// events, in order.
func testOrderDueKeys(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	var keys []string
	for i := range 5 {
		k := fmt.Sprintf("k%02d", i)
		e.pubOrdered(t, k, "", blockS)
		keys = append(keys, k)
	}
	e.pubOrdered(t, "k01", "", blockS) // a second event: listed once
	e.pubOrdered(t, "held", "me", blockS)
	later, _ := e.pubOrdered(t, "later", "me", blockS)
	if err := e.store.Release(ctx, "me", []string{later}, time.Hour); err != nil {
		t.Fatal(err)
	}
	done, _ := e.pubOrdered(t, "done", "me", blockS)
	if n, err := e.store.MarkDone(ctx, "me", []string{done}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	plain := driver.Row{ID: outbox.NewID(), Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: "plain"}
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
	var got []string
	after := ""
	for page := 0; ; page++ {
		ks, err := os.DueKeys(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) > 2 {
			t.Fatalf("DueKeys(limit 2) = %v", ks)
		}
		got = append(got, ks...)
		if len(ks) < 2 || page > 10 {
			break
		}
		after = ks[len(ks)-1]
	}
	if !slices.Equal(got, keys) {
		t.Fatalf("DueKeys, two at a time = %v; want %v", got, keys)
	}
	if ks, err := os.DueKeys(ctx, "", 0); err != nil || len(ks) != 0 {
		t.Fatalf("DueKeys(limit 0) = %v, %v", ks, err)
	}
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
		if ok, err := ds.Split(ctx, "me", two, []driver.DeliveryWrite{{Subscription: sub, Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("%s: Split = %v, %v", key, ok, err)
		}
		return one, two
	}
	one, two := pair("blk-retry", "blk", outbox.StatusRetry)
	claim("blk: the first retry, not the second in its key", "blk", one)
	claim("blk: nothing while the first is leased", "blk")
	if n, err := ds.CompleteDeliveries(ctx, "c", []driver.DeliveryKey{{EventID: one, Subscription: "blk"}}); err != nil || n != 1 {
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
