package main

import "testing"

// The example runs end to end: publish, a lost answer, the retry, one
// invoice.
func TestRun(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
