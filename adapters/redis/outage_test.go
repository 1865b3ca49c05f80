package redisoutbox_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// Redis goes away in the middle of a steady stream of events (a proxy cuts
// every connection and refuses new ones; the shared server keeps running),
// events keep coming, then it comes back: no event is lost or dead, every
// one is in the stream afterwards, and none spent an attempt (the
// connector reports the outage as outbox.Unavailable and the circuit
// holds the events). Both modes.
func TestOutage(t *testing.T) {
	for _, idem := range []bool{false, true} {
		name := "default"
		if idem {
			name = "idempotent"
		}
		t.Run(name, func(t *testing.T) { outage(t, idem) })
	}
}

func outage(t *testing.T, idem bool) {
	proxy := testbroker.NewProxy(t, testbroker.Redis(t))
	so := setupOpts{
		addr: proxy.Addr(),
		// Two attempts: an outage that spent attempts would kill events.
		sub: outbox.Subscription{MaxAttempts: 2, CircuitThreshold: 3, CircuitProbe: 100 * time.Millisecond, CircuitMaxProbe: 200 * time.Millisecond, Timeout: 2 * time.Second},
	}
	if idem {
		so.cfg.IdempotentTTL = time.Minute
	}
	f := setup(t, so)

	const total = 300
	var published atomic.Int64
	ids := make([]string, total)
	done := make(chan struct{})
	go func() { // a steady stream of events, one per transaction
		defer close(done)
		for i := range total {
			ids[i] = f.publish(outbox.Envelope{Type: "Tick", JSON: []byte(`{}`)})[0]
			published.Add(1)
			time.Sleep(2 * time.Millisecond) // pacing, not synchronisation
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	f.waitLen(f.stream, 50, 10*time.Second)
	proxy.Cut()
	cutAt := published.Load()
	waitFor("the circuit to open", func() bool { return f.ob.Subscriptions()[0].Circuit == outbox.CircuitOpen })
	waitFor("events published during the outage", func() bool { return published.Load() >= cutAt+100 })
	during := f.rdb.XLen(f.ctx, f.stream).Val()
	proxy.Restore()
	restoredAt := published.Load()
	<-done

	got := f.settled(ids, 30*time.Second)
	dead, spent := 0, 0
	for _, id := range ids {
		o := got[id]
		if o.status == outbox.StatusDead {
			dead++
			t.Errorf("event %s dead: %s", id, o.lastError)
		}
		if o.attempts > 0 {
			spent++
		}
	}
	es := f.entries(f.stream)
	seen := map[string]int{}
	for _, e := range es {
		seen[e.get("txoutbox-id")]++
	}
	lost, dups := 0, 0
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			lost++
		case n > 1:
			dups += n - 1
		}
	}
	t.Logf("cut after %d published (%d stored), restored after %d; %d entries for %d events: %d lost, %d duplicates, %d dead, %d with attempts spent",
		cutAt, during, restoredAt, len(es), total, lost, dups, dead, spent)
	if lost != 0 || dead != 0 || spent != 0 {
		t.Fatalf("%d lost, %d dead, %d with attempts spent; want none", lost, dead, spent)
	}
	if idem && dups != 0 {
		t.Fatalf("idempotent: %d duplicates", dups)
	}
	if restoredAt-cutAt < 100 {
		t.Fatalf("only %d events published during the outage", restoredAt-cutAt)
	}
}
