package storetest

import (
	"context"
	"sync"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
)

// DeliverOne takes exactly one due event and returns once its outcome is
// recorded; Drain takes the rest and returns once nothing is due; both
// refuse an outbox that is not started.
func testDeliverOneAndDrain(t *testing.T, e *env) {
	ctx := context.Background()
	cfg := fastConfig()
	cfg.DisableHotPath = true // everything waits in the table
	cfg.DisablePoller = true  // only DeliverOne and Drain take it
	ob := e.outbox(t, cfg)
	var mu sync.Mutex
	seen := map[string]int{}
	ob.Handle("count", func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		seen[ev.ID]++
		mu.Unlock()
		return nil
	}, typeA)
	if _, err := ob.DeliverOne(ctx); err == nil {
		t.Fatal("DeliverOne before Start succeeded; want an error saying to start")
	}
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte{'0' + byte(i)}}))
	}
	ok, err := ob.DeliverOne(ctx)
	if err != nil || !ok {
		t.Fatalf("DeliverOne = %v, %v; want one delivered", ok, err)
	}
	done := 0
	for _, id := range ids {
		if e.inspect(t, id).Status == outbox.StatusDone {
			done++
		}
	}
	mu.Lock()
	calls := len(seen)
	mu.Unlock()
	if done != 1 || calls != 1 {
		t.Fatalf("after DeliverOne: %d DONE, %d handled; want 1 and 1 (recorded before it returns)", done, calls)
	}
	n, err := ob.Drain(ctx)
	if err != nil || n != 4 {
		t.Fatalf("Drain = %d, %v; want the 4 left", n, err)
	}
	for _, id := range ids {
		if st := e.inspect(t, id).Status; st != outbox.StatusDone {
			t.Fatalf("event %s is %v after Drain; want DONE", id, st)
		}
		mu.Lock()
		c := seen[id]
		mu.Unlock()
		if c != 1 {
			t.Fatalf("event %s handled %d times; want 1", id, c)
		}
	}
	if ok, err := ob.DeliverOne(ctx); err != nil || ok {
		t.Fatalf("DeliverOne on an empty table = %v, %v; want nothing", ok, err)
	}
	if n, err := ob.Drain(ctx); err != nil || n != 0 {
		t.Fatalf("second Drain = %d, %v; want 0", n, err)
	}
}
