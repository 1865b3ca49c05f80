package main

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testbroker"
)

// The example runs end to end against the Redis of the tests.
func TestRun(t *testing.T) {
	if err := run(testbroker.Redis(t)); err != nil {
		t.Fatal(err)
	}
}
