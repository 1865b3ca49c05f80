package main

import "testing"

// The example runs end to end on kfake.
func TestRun(t *testing.T) {
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
