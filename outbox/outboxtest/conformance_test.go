package outboxtest_test

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/storetest"
)

// TestConformance runs the store conformance suite on the in-memory store.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
			st := outboxtest.NewStore()
			return st, func(ctx context.Context) (storetest.Tx, error) { return st.Begin(ctx), nil }
		},
		ConcurrentWriters: true,
	})
}

func TestMain(m *testing.M) { leakcheck.Main(m) }
