package outbox

import (
	"fmt"
	"testing"
)

func orderedItem(key string, seq int64) *item {
	return &item{env: Envelope{ID: fmt.Sprintf("%s-%d", key, seq), OrderingKey: key, ordered: true, seq: seq}}
}

// The chain of a key: the head starts it, the next waits behind it and
// runs once it is delivered, a gap is given back, a failure gives back
// what waited, and a key delivered here lets its next event go without
// the store's word.
func TestKeyTableChain(t *testing.T) {
	kt := newKeyTable()
	if got := kt.committed(orderedItem("k", 2), false); got != commitRelease {
		t.Fatalf("an event neither head nor after one here: %v, want release", got)
	}
	if got := kt.committed(orderedItem("k", 1), true); got != commitGo {
		t.Fatalf("the head: %v, want go", got)
	}
	e2, e3 := orderedItem("k", 2), orderedItem("k", 3)
	if got := kt.committed(e2, false); got != commitWait {
		t.Fatalf("the event after the running one: %v, want wait", got)
	}
	if got := kt.committed(orderedItem("k", 5), true); got != commitRelease {
		t.Fatalf("an event after a gap in the chain: %v, want release", got)
	}
	if got := kt.committed(e3, false); got != commitWait {
		t.Fatalf("the event after the chain's tail: %v, want wait", got)
	}
	if next := kt.delivered(orderedItem("k", 1)); next != e2 {
		t.Fatalf("after 1 was delivered the chain runs %v, want 2", next)
	}
	if next := kt.delivered(orderedItem("k", 3)); next != nil {
		t.Fatalf("an event that is not running passed the key on to %v", next)
	}
	if back := kt.failed(e2); len(back) != 1 || back[0] != e3 {
		t.Fatalf("2 failed: gave back %v, want [3]", back)
	}
	if _, ok := kt.chains["k"]; ok {
		t.Fatal("the chain outlived its failed event")
	}
	// Delivered here: the next event goes without being the head.
	if got := kt.committed(orderedItem("j", 1), true); got != commitGo {
		t.Fatalf("the head of j: %v", got)
	}
	if next := kt.delivered(orderedItem("j", 1)); next != nil {
		t.Fatalf("nothing waited behind j:1, got %v", next)
	}
	if got := kt.committed(orderedItem("j", 2), false); got != commitGo {
		t.Fatalf("the event after one delivered here: %v, want go", got)
	}
	if got := kt.committed(orderedItem("i", 3), false); got != commitRelease {
		t.Fatalf("an event after one this instance never saw: %v, want release", got)
	}
	w := orderedItem("j", 3)
	if got := kt.committed(w, false); got != commitWait {
		t.Fatalf("j:3 behind the running j:2: %v", got)
	}
	if back := kt.drain(); len(back) != 1 || back[0] != w {
		t.Fatalf("drain gave back %v, want [j:3]", back)
	}
}

// The table remembers a bounded number of keys: two generations, the
// older dropped when the newer fills.
func TestKeyTableForgetsOldKeys(t *testing.T) {
	kt := newKeyTable()
	kt.leased("first", 7)
	for i := range 2 * maxRecentKeys {
		kt.leased(fmt.Sprint(i), 1)
	}
	if got := kt.after("first"); got != 0 {
		t.Fatalf("a key seen %d keys ago is still remembered (%d)", 2*maxRecentKeys, got)
	}
	if len(kt.recent)+len(kt.older) > 2*maxRecentKeys {
		t.Fatalf("%d keys remembered, want at most %d", len(kt.recent)+len(kt.older), 2*maxRecentKeys)
	}
	last := fmt.Sprint(2*maxRecentKeys - 1)
	if got := kt.after(last); got != 1 {
		t.Fatalf("the last key seen: after = %d, want 1", got)
	}
	kt.leased(last, 4)
	if got := kt.after(last); got != 4 {
		t.Fatalf("after = %d, want the highest number leased, 4", got)
	}
}

// holdsAfter: an event of the key numbered past seq is in this
// instance's hands (its chain runs past seq) or was delivered here; one
// given back to the table is neither.
func TestKeyTableHoldsAfter(t *testing.T) {
	kt := newKeyTable()
	if kt.holdsAfter("k", 1) {
		t.Fatal("a key never seen holds an event after 1")
	}
	kt.committed(orderedItem("k", 1), true)
	e2 := orderedItem("k", 2)
	kt.committed(e2, false) // waits behind 1
	if !kt.holdsAfter("k", 1) {
		t.Fatal("2 waits here behind 1: holdsAfter(1) = false")
	}
	kt.delivered(orderedItem("k", 1)) // 2 runs
	if !kt.holdsAfter("k", 1) {
		t.Fatal("2 runs here after 1: holdsAfter(1) = false")
	}
	if kt.holdsAfter("k", 2) {
		t.Fatal("nothing after 2 here: holdsAfter(2) = true")
	}
	kt.delivered(e2)
	if !kt.holdsAfter("k", 1) {
		t.Fatal("2 was delivered here: holdsAfter(1) = false")
	}
	// A chain that failed gives its events back: they are not held.
	kt.committed(orderedItem("j", 1), true)
	j2 := orderedItem("j", 2)
	kt.committed(j2, false)
	kt.delivered(orderedItem("j", 1)) // j:2 runs
	kt.failed(j2)
	if kt.holdsAfter("j", 1) {
		t.Fatal("j:2 failed and went back to the table: holdsAfter(1) = true")
	}
	if kt.holdsAfter("k", 0) {
		t.Fatal("holdsAfter of an unknown number")
	}
}
