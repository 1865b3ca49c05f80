package oteloutbox_test

import (
	"testing"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
)

// TestMain fails the run if an outbox or connector goroutine outlives the
// tests.
func TestMain(m *testing.M) { leakcheck.Main(m) }
