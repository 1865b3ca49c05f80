package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Helpers of the ordering cases (driver.OrderedStore).

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

// splitHead leases key's first event, which must be the only one before
// next, and splits it with writes.
func (e *env) splitHead(t *testing.T, key string, writes ...driver.DeliveryWrite) (first, next string) {
	t.Helper()
	first, _ = e.pubOrdered(t, key, "me", bothS)
	next, _ = e.pubOrdered(t, key, "", bothS)
	if ok, err := splitOne(context.Background(), e.ds(), "me", first, writes, e.registry(t)); err != nil || !ok {
		t.Fatalf("Split = %v, %v", ok, err)
	}
	return first, next
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

// rowKeys returns the ordering keys of rows, in order.
func rowKeys(rows []driver.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.OrderingKey
	}
	return out
}
