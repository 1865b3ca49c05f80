package outboxtest_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/storetest"
)

// hintless is the in-memory store as a store that ignores every hint the
// engine gives it (driver.Row.KeyAfter, driver.ClaimRequest.Run, the keys
// MarkDoneKeys may report as having no later events): what a stranger's
// first store would do.
type hintless struct{ *outboxtest.Store }

func (s hintless) InsertOrdered(ctx context.Context, exec driver.Execer, row *driver.Row, owner string, lease time.Duration, f driver.OrderFilter) (bool, bool, error) {
	row.KeyAfter = 0
	return s.Store.InsertOrdered(ctx, exec, row, owner, lease, f)
}

func (s hintless) ClaimHeads(ctx context.Context, req driver.ClaimRequest, keys []string, f driver.OrderFilter) ([]driver.Row, error) {
	req.Run = 0
	return s.Store.ClaimHeads(ctx, req, keys, f)
}

func (s hintless) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	req.Run = 0
	return s.Store.ClaimDeliveries(ctx, req, subs, f)
}

func (s hintless) MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []driver.KeyDone, registry int64) (int, []string, error) {
	n, _, err := s.Store.MarkDoneKeys(ctx, owner, ids, evs, registry)
	var later []string
	for _, ev := range evs {
		later = append(later, ev.Key) // every key may have later events
	}
	slices.Sort(later)
	return n, slices.Compact(later), err
}

// The engine's hints are hints: a store that ignores them all passes the
// engine's part of the conformance suite (order, at least once, one
// delivery at a time per key) — slower, never wrong. The hints stay in
// the contract for the stores that can use them (sqlstore).
func TestConformanceIgnoringHints(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
			st := outboxtest.NewStore()
			return hintless{st}, func(ctx context.Context) (storetest.Tx, error) { return st.Begin(ctx), nil }
		},
		ConcurrentWriters: true,
		IgnoresHints:      true,
	})
}
