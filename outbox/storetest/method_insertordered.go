package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OrderedStore.InsertOrdered (with KeysDone, which
// moves a key's head).

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
