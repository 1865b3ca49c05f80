package outbox

import "testing"

// The completer names a key to the sequencer only once no other DONE of
// the key is still to be written here: the last event of a run, written
// before the one before it (the workers hand events over in the order
// they finish), must not have the key claimed while that one's lease
// still holds it; the naming waits for it.
func TestKeyCompletionsNameAKeyAfterItsLastPendingDone(t *testing.T) {
	var k keyCompletions
	k.add("a")
	k.add("a")
	k.add("b")
	if _, ok := k.done("a", true, 5); ok {
		t.Fatal("key a named while another of its events waits for its DONE")
	}
	if _, ok := k.done("b", true, 1); !ok {
		t.Fatal("key b not named: none of its events is pending")
	}
	if past, ok := k.done("a", false, 4); !ok || past != 5 {
		t.Fatalf("key a: named %v past %d after its last pending DONE, want named past 5 (the earlier one asked for it)", ok, past)
	}
	k.add("a")
	if _, ok := k.done("a", false, 6); ok {
		t.Fatal("key a named though nothing asked for it")
	}
	// The highest number that named the key is what the sequencer tests
	// against (keyTable.holdsAfter), unless one had no number.
	k.add("c")
	k.add("c")
	k.add("c")
	k.done("c", true, 7)
	k.done("c", true, 9)
	if past, ok := k.done("c", true, 8); !ok || past != 9 {
		t.Fatalf("key c: named %v past %d, want named past 9", ok, past)
	}
	k.add("d")
	k.add("d")
	k.done("d", true, 0)
	if past, ok := k.done("d", true, 3); !ok || past != 0 {
		t.Fatalf("key d: named %v past %d, want named past 0 (one of its events had no number)", ok, past)
	}
	if len(k.pending) != 0 || len(k.owed) != 0 {
		t.Fatalf("keys left behind: pending %v, owed %v", k.pending, k.owed)
	}
}
