package main

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// The example runs end to end against the NATS server of the tests.
func TestRun(t *testing.T) {
	if err := run(testbroker.NATS(t), "EXAMPLE_INBOX_TEST_"+outbox.NewID()); err != nil {
		t.Fatal(err)
	}
}
