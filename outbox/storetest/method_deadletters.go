package storetest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.DeadLetterStore: ListDead and Replay.

// Dead letters can be listed (without payloads) and replayed.
func testReplay(t *testing.T, e *env) {
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	cfg := fastConfig()
	cfg.MaxAttempts = 1
	ob := e.outbox(t, cfg)
	var fail atomic.Bool
	fail.Store(true)
	attempts := make(chan outbox.Event, 4)
	ob.Handle("listener-12", func(_ context.Context, ev outbox.Event) error {
		attempts <- ev
		if fail.Load() {
			return errAlwaysFails
		}
		return nil
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, attempts, "the failing attempt")
	ctx := context.Background()
	var list []outbox.DeadLetter
	deadline := time.Now().Add(wait)
	for len(list) == 0 && time.Now().Before(deadline) { // the DEAD write follows the listener
		var err error
		if list, err = dls.ListDead(ctx, "", 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(list) != 1 || list[0].ID != id || list[0].Attempts != 1 || !strings.Contains(list[0].LastError, errAlwaysFails.Error()) {
		t.Fatalf("dead letters %+v", list)
	}
	fail.Store(false)
	if n, err := dls.Replay(ctx, []string{id, "no-such-id"}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v; want 1", n, err)
	}
	ev := recv(t, attempts, "the replayed delivery")
	if ev.ID != id || ev.Attempt != 1 {
		t.Fatalf("replayed %+v", ev)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
}

// Dead letters are per subscription: ListDead names the subscription that
// gave up, and Replay runs only it again.
func testDeadPerSubscription(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	var good, bad callCounter
	var fixed atomic.Bool
	dead := make(chan string, 1)
	replayed := make(chan string, 1)
	ob.Handle("good", func(_ context.Context, ev outbox.Event) error { good.add(ev.ID); return nil }, typeA)
	ob.Handle("bad", func(_ context.Context, ev outbox.Event) error {
		if bad.add(ev.ID) == 1 {
			defer func() { dead <- ev.ID }()
			return outbox.Permanent(errors.New("schema mismatch"))
		}
		if fixed.Load() {
			replayed <- ev.ID
		}
		return nil
	}, typeA)
	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, dead, "the bad subscription's failure")
	waitFor(t, "the dead delivery", func() bool {
		rec := e.inspect(t, id)
		return len(rec.Deliveries) == 1 && rec.Deliveries[0].Status == outbox.StatusDead
	})
	dls, err := e.store.(driver.DeadLetterStore).ListDead(context.Background(), "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].ID != id || dls[0].Subscription != "bad" || dls[0].LastError != "schema mismatch" || dls[0].Attempts != 1 {
		t.Fatalf("ListDead = %+v; want the bad subscription's delivery of %s", dls, id)
	}
	fixed.Store(true)
	if n, err := e.store.(driver.DeadLetterStore).Replay(context.Background(), []string{id}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v; want 1", n, err)
	}
	if got := recv(t, replayed, "the replayed delivery"); got != id {
		t.Fatalf("replayed %s; want %s", got, id)
	}
	waitFor(t, "the event DONE", func() bool { return e.inspect(t, id).Status == outbox.StatusDone })
	closeNow(t, ob)
	if g := good.get(id); g != 1 {
		t.Fatalf("the good subscription ran %d times; want 1 (replay never re-runs it)", g)
	}
}
