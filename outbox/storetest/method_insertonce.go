package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OnceInserter (Outbox.PublishOnce), an optional
// interface: skipped for a store without it.

// An id that exists, committed or written earlier in the same
// transaction, is ErrDuplicateID, with nothing written and the
// transaction usable; another error of insert comes back as it is, with
// what insert wrote undone.
func testMethodInsertOnce(t *testing.T, e *env) {
	oi, ok := e.store.(driver.OnceInserter)
	if !ok {
		t.Skip("storetest: the store does not implement driver.OnceInserter")
	}
	ctx := context.Background()
	row := func(id string) *driver.Row {
		return &driver.Row{ID: id, Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
	}
	once := func(tx Tx, id string) error {
		return oi.InsertOnce(ctx, tx, id, func() error { return e.store.Insert(ctx, tx, row(id), "", 0) })
	}
	id, other, undone := outbox.NewID(), outbox.NewID(), outbox.NewID()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.h.RefusesOnce {
		if err := once(tx, id); err == nil || errors.Is(err, driver.ErrDuplicateID) {
			t.Errorf("InsertOnce on a store that refuses it (Harness.RefusesOnce): %v; want an error that says why", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		e.wantMissing(t, id)
		return
	}
	if err := once(tx, id); err != nil {
		t.Fatalf("InsertOnce of a new id: %v", err)
	}
	if err := once(tx, id); !errors.Is(err, driver.ErrDuplicateID) {
		t.Errorf("InsertOnce of an id written earlier in the transaction: %v; want ErrDuplicateID", err)
	}
	boom := errors.New("the caller's insert failed")
	err = oi.InsertOnce(ctx, tx, undone, func() error {
		if err := e.store.Insert(ctx, tx, row(undone), "", 0); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("InsertOnce whose insert failed: %v; want its error", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after InsertOnce refused an id: %v (the transaction must stay usable)", err)
	}
	e.wantMissing(t, undone)
	tx, err = e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := once(tx, id); !errors.Is(err, driver.ErrDuplicateID) {
		t.Errorf("InsertOnce of a committed id: %v; want ErrDuplicateID", err)
	}
	if err := e.store.Insert(ctx, tx, row(other), "", 0); err != nil {
		t.Fatalf("insert after InsertOnce refused an id: %v (the transaction must stay usable)", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit after InsertOnce refused an id: %v", err)
	}
	for _, id := range []string{id, other} {
		if rec := e.inspect(t, id); rec.ID != id {
			t.Errorf("event %s read as %q", id, rec.ID)
		}
	}
}

// wantMissing fails unless the store has no event id.
func (e *env) wantMissing(t *testing.T, id string) {
	t.Helper()
	if _, err := e.store.(driver.Inspector).Inspect(context.Background(), id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("event %s: Inspect says %v; want it not written", id, err)
	}
}
