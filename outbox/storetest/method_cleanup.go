package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.Cleaner.Cleanup.

// Cleanup deletes delivered rows and never an undelivered one.
func testCleanup(t *testing.T, e *env) {
	cl, ok := e.store.(driver.Cleaner)
	if !ok {
		t.Skip("store is not an driver.Cleaner")
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	ob := e.outbox(t, cfg)
	rec := newRecorder(3)
	ob.Handle("listener-13", rec.listen, typeA)
	start(t, ob)
	for range 3 {
		e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	rec.wait(t, wait)
	closeNow(t, ob)
	pending := e.outbox(t, outbox.Config{DisableHotPath: true})
	keep := e.publish(t, pending, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	n, err := cl.Cleanup(context.Background(), -time.Hour, 100, true)
	want := int64(3)
	if e.h.DeletesDelivered {
		want = 0 // gone at delivery
	}
	if err != nil || n != want {
		t.Fatalf("Cleanup = %d, %v; want %d", n, err, want)
	}
	e.wantStatus(t, keep, outbox.StatusNew)
	if s := e.stats(t); s.Done != 0 || s.New != 1 {
		t.Fatalf("after cleanup %+v", s)
	}
}
