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
	if k.done("a", true) {
		t.Fatal("key a named while another of its events waits for its DONE")
	}
	if !k.done("b", true) {
		t.Fatal("key b not named: none of its events is pending")
	}
	if !k.done("a", false) {
		t.Fatal("key a not named after its last pending DONE, though an earlier one asked for it")
	}
	k.add("a")
	if k.done("a", false) {
		t.Fatal("key a named though nothing asked for it")
	}
	if len(k.pending) != 0 || len(k.owed) != 0 {
		t.Fatalf("keys left behind: pending %v, owed %v", k.pending, k.owed)
	}
}
