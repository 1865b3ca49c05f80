package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of the owner-checked writes of driver.Store: MarkDone,
// MarkRetry, MarkDead, ExtendLeases and Release.

// A worker whose lease expired and was taken over cannot change the row.
func testZombie(t *testing.T, e *env) {
	ctx := context.Background()
	producer := e.outbox(t, outbox.Config{DisableHotPath: true})
	id := e.publish(t, producer, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	claim := func(owner string, lease time.Duration) []driver.Row {
		rows, err := e.store.Claim(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: lease})
		if err != nil {
			t.Fatalf("Claim(%s): %v", owner, err)
		}
		return rows
	}
	// The zombie's lease must outlast the next claim even on a loaded
	// machine (30 ms did not, once in a full -race run beside other
	// work: the second claim then rightly took the expired row).
	if rows := claim("zombie", time.Second); len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("zombie claimed %v", rows)
	}
	if rows := claim("other", time.Minute); len(rows) != 0 {
		t.Fatalf("claimed a row under a live lease: %v", rows)
	}
	// Wait, on the database's clock, for the zombie's lease to run out.
	deadline := time.Now().Add(wait)
	var taken []driver.Row
	for len(taken) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the expired lease was never taken over")
		}
		time.Sleep(5 * time.Millisecond)
		taken = claim("successor", time.Minute)
	}
	if taken[0].PrevOwner != "zombie" {
		t.Fatalf("PrevOwner %q, want zombie", taken[0].PrevOwner)
	}
	if n, err := e.store.MarkDone(ctx, "zombie", []string{id}, e.registry(t)); err != nil || n != 0 {
		t.Fatalf("zombie MarkDone changed %d rows (err %v)", n, err)
	}
	if ok, err := e.store.MarkRetry(ctx, "zombie", id, 0, "late"); err != nil || ok {
		t.Fatalf("zombie MarkRetry = %v (err %v)", ok, err)
	}
	if ok, err := e.store.MarkDead(ctx, "zombie", id, "late"); err != nil || ok {
		t.Fatalf("zombie MarkDead = %v (err %v)", ok, err)
	}
	if n, err := e.store.ExtendLeases(ctx, "zombie", []string{id}, time.Hour); err != nil || n != 0 {
		t.Fatalf("zombie ExtendLeases = %d (err %v)", n, err)
	}
	if err := e.store.Release(ctx, "zombie", []string{id}, 0); err != nil {
		t.Fatal(err)
	}
	rec := e.wantStatus(t, id, outbox.StatusNew)
	if rec.Owner != "successor" || rec.Attempts != 0 || rec.LastError != "" {
		t.Fatalf("row after the zombie's writes: owner %q attempts %d error %q", rec.Owner, rec.Attempts, rec.LastError)
	}
	if n, err := e.store.MarkDone(ctx, "successor", []string{id}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("successor MarkDone = %d (err %v)", n, err)
	}
	e.wantStatus(t, id, outbox.StatusDone)
}
