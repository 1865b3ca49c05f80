package storetest

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OrderedStore.MarkDoneKeys.

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
