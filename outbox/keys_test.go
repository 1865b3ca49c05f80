package outbox

import (
	"fmt"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
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

// Row.KeyLast is the highest number of a key this instance's own
// transactions committed, for keyLastFor after the last commit, and only
// that: numbers leased or delivered here (which may be old, replayed
// events) do not count.
func TestKeyTableLastIsACommittedNumberForAFewSeconds(t *testing.T) {
	kt := newKeyTable()
	start := time.Now()
	kt.leased("k", 7)
	kt.claimed(orderedItem("k", 9))
	if got, try := kt.last("k", start); got != 0 || try {
		t.Fatalf("KeyLast of a key only leased and claimed here: %d (passed: %v); want 0, not passed", got, try)
	}
	committed := func(at time.Time, keySeqs ...any) {
		var rows []driver.Row
		var idx []int
		for i := 0; i < len(keySeqs); i += 2 {
			rows = append(rows, driver.Row{OrderingKey: keySeqs[i].(string), KeySeq: int64(keySeqs[i+1].(int))})
			idx = append(idx, len(rows)-1)
		}
		kt.committedNumbers(rows, idx, at)
	}
	kt.numbered("k", 0, 1) // the key's first event was published here
	committed(start, "k", 4, "j", 2, "k", 3)
	committed(start, "k", 3) // a slower transaction's commit reported later
	if got, try := kt.last("k", start.Add(keyLastFor-time.Millisecond)); got != 4 || !try {
		t.Fatalf("KeyLast just before it expires: %d (passed: %v); want 4, passed", got, try)
	}
	if got, try := kt.last("k", start.Add(keyLastFor)); got != 4 || try {
		t.Fatalf("KeyLast %v after the commit: %d (passed: %v); want 4, not passed (expired)", keyLastFor, got, try)
	}
	committed(start.Add(time.Minute), "k", 5)
	if got, try := kt.last("k", start.Add(time.Minute+time.Second)); got != 5 || !try {
		t.Fatalf("KeyLast after a new commit: %d (passed: %v); want 5, passed", got, try)
	}
}

// KeyLast is passed only while the key's events keep to this instance:
// once a number comes out past the instance's own last one (another
// instance numbered in between, whether the try from KeyLast found its
// number taken or the key's row was ahead), Publish goes to the key's row
// until tryStreak numbers in a row right after its own show the key is
// back.
func TestKeyTableLastOnlyWhileTheKeyKeepsToThisInstance(t *testing.T) {
	kt := newKeyTable()
	now := time.Now()
	publish := func(key string, seq int64) (passed bool) {
		prev, try := kt.last(key, now)
		kt.numbered(key, prev, seq)
		kt.committedNumbers([]driver.Row{{OrderingKey: key, KeySeq: seq}}, []int{0}, now)
		return try
	}
	// The key's first event, published here: nothing known, nothing
	// passed; then the key is taken to keep to this instance.
	if publish("k", 1) {
		t.Fatal("KeyLast passed for a key with no number committed here")
	}
	if !publish("k", 2) || !publish("k", 3) {
		t.Fatal("KeyLast not passed while every number follows this instance's own")
	}
	// Another instance took 4 (the try from 3 was refused): 5.
	if !publish("k", 5) {
		t.Fatal("the try that found 4 taken was passed KeyLast 3; want passed")
	}
	// Its events change instance: no more tries, even when one number
	// happens to follow (what a key spread over two instances does every
	// other time).
	for _, seq := range []int64{7, 9, 10, 12} {
		if publish("k", seq) {
			t.Fatalf("KeyLast passed for event %d of a key whose events change instance", seq)
		}
	}
	// tryStreak numbers in a row right after this instance's own: back.
	for seq := int64(13); seq < 13+tryStreak; seq++ {
		if publish("k", seq) {
			t.Fatalf("KeyLast passed for event %d, before %d numbers in a row followed this instance's own", seq, tryStreak)
		}
	}
	if !publish("k", 13+tryStreak) {
		t.Fatalf("KeyLast not passed after %d numbers in a row followed this instance's own", tryStreak)
	}
	// A key others published before this instance knew it (a restart):
	// no try until it shows it keeps to this instance.
	for seq := int64(40); seq <= 40+tryStreak; seq++ {
		if publish("j", seq) {
			t.Fatalf("KeyLast passed for event %d of a key others published before, %d numbers after the first known here", seq, seq-40)
		}
	}
	if !publish("j", 41+tryStreak) {
		t.Fatalf("KeyLast not passed after %d numbers in a row followed this instance's own", tryStreak)
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

// lastCommitted: the highest number this instance committed for the key,
// and only that one.
func TestKeyTableLastCommitted(t *testing.T) {
	kt := newKeyTable()
	now := time.Now()
	if kt.lastCommitted("k", 1) {
		t.Fatal("nothing committed, yet 1 is the last")
	}
	kt.committedNumbers([]driver.Row{{OrderingKey: "k", KeySeq: 1}, {OrderingKey: "k", KeySeq: 2}}, []int{0, 1}, now)
	if !kt.lastCommitted("k", 2) || kt.lastCommitted("k", 1) || kt.lastCommitted("k", 3) {
		t.Fatalf("after committing 1 and 2: last 1 %v, 2 %v, 3 %v; want only 2", kt.lastCommitted("k", 1), kt.lastCommitted("k", 2), kt.lastCommitted("k", 3))
	}
	kt.leased("j", 4) // leased or claimed here, not committed here
	if kt.lastCommitted("j", 4) {
		t.Fatal("a number leased here counts as committed here")
	}
}
