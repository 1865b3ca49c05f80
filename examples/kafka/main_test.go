package main

import "testing"

// The program delivers its event through an in-process Kafka.
func TestRunOnKfake(t *testing.T) {
	if err := run("", "orders"); err != nil {
		t.Fatal(err)
	}
}
