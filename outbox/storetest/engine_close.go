package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Engine cases: Start and Close.

// Close delivers what is queued before it returns.
func testCloseDrains(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 2
	ob := e.outbox(t, cfg)
	const n = 300
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	ids := e.publishMany(t, ob, typeA, n) // queued, not yet started
	start(t, ob)
	closeNow(t, ob)
	counts, _ := rec.snapshot()
	if len(counts) != n {
		t.Fatalf("Close returned after %d of %d queued events", len(counts), n)
	}
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
}

// Close with an expired context cancels the running listener and hands the
// queued events back: NEW, no owner, no attempt counted.
func testCloseHandsBack(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 1
	ob := e.outbox(t, cfg)
	entered := make(chan struct{}, 1)
	ob.Handle("all", func(ctx context.Context, _ outbox.Event) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})

	ids := e.publishMany(t, ob, typeA, 10)
	start(t, ob)
	recv(t, entered, "the first delivery")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ob.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, id := range ids {
		rec := e.wantStatus(t, id, outbox.StatusNew)
		if rec.Owner != "" || rec.Attempts != 0 {
			t.Fatalf("event %s after Close: owner %q attempts %d; want handed back, no attempt", id, rec.Owner, rec.Attempts)
		}
	}
}

// Close with an expired context reports a listener call that ignores its
// cancelled context instead of waiting for it forever.
func testCloseReportsStuckListener(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 1
	ob := e.outbox(t, cfg)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	returned := make(chan struct{})
	ob.Handle("all", func(context.Context, outbox.Event) error {
		defer close(returned)
		entered <- struct{}{}
		<-release
		return nil
	})

	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	start(t, ob)
	recv(t, entered, "the delivery")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := ob.Close(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "ignored their context") {
		t.Fatalf("Close = %v; want an error naming the listener that ignored its context", err)
	}
	close(release)
	recv(t, returned, "the stuck listener to return")
	e.wantStatus(t, id, outbox.StatusNew) // handed back, not lost
}

// Start and Close in any order, repeatedly and concurrently, with
// publishes in flight: no race, no deadlock, no goroutine left.
func testStartCloseStress(t *testing.T, e *env) {
	for range 15 {
		cfg := fastConfig()
		cfg.HotQueueSize = 8
		ob := e.outbox(t, cfg)
		ob.Handle("all", func(context.Context, outbox.Event) error { return nil })
		var wg sync.WaitGroup
		wg.Go(func() { ob.Start(context.Background()) })
		wg.Go(func() { ob.Start(context.Background()) })
		wg.Go(func() {
			for range 5 {
				e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
			}
		})
		wg.Wait()
		wg.Go(func() { ob.Close(context.Background()) })
		wg.Go(func() { ob.Close(context.Background()) })
		wg.Wait()
		if err := ob.Start(context.Background()); !errors.Is(err, outbox.ErrClosed) {
			t.Fatalf("Start after Close: %v, want ErrClosed", err)
		}
	}
	never := e.outbox(t, fastConfig())
	if err := never.Close(context.Background()); err != nil {
		t.Fatalf("Close without Start: %v", err)
	}
}

// Close while a claim is in flight never leaves rows leased to the closed
// instance: a claim that started finishes, and what it took is handed
// back.
func testCloseDuringClaim(t *testing.T, e *env) {
	const rows, closes = 20, 300
	free := e.outbox(t, outbox.Config{DisableHotPath: true})
	ids := e.publishMany(t, free, typeA, rows)
	stranded := 0
	for i := range closes {
		claiming := make(chan struct{}, 1)
		st := hooked(e.store)
		st.claim = func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
			select {
			case claiming <- struct{}{}:
			default:
			}
			return e.store.Claim(ctx, req)
		}
		cfg := fastConfig()
		cfg.StatsInterval = -1
		cfg.InstanceID = fmt.Sprintf("closer-%d", i)
		ob := e.outboxOn(t, st.releasingByOwner(i%2 == 0), cfg)
		ob.Handle("all", func(ctx context.Context, _ outbox.Event) error { <-ctx.Done(); return ctx.Err() })
		start(t, ob)
		<-claiming
		// Land the cancellation anywhere in the claim: at BEGIN, in the
		// SELECT, in the UPDATE or in the COMMIT (a claim takes a few
		// milliseconds). The spread is the fault injected, not a wait for
		// something to happen.
		time.Sleep(time.Duration(i%16) * 250 * time.Microsecond)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // hand back at once, do not drain
		if err := ob.Close(ctx); err != nil {
			t.Fatalf("Close %d: %v", i, err)
		}
		for _, id := range ids {
			if rec := e.inspect(t, id); rec.Owner == cfg.InstanceID {
				stranded++
			}
		}
	}
	if stranded > 0 {
		t.Fatalf("%d rows left leased to a closed instance over %d Close calls racing claims; want 0", stranded, closes)
	}
	for _, id := range ids {
		if rec := e.wantStatus(t, id, outbox.StatusNew); rec.Attempts != 0 {
			t.Fatalf("event %s: %d attempts after cancelled deliveries; want 0", id, rec.Attempts)
		}
	}
}

// A claim that the database commits after Close cut it off (the engine's
// grace period over, the claim's context cancelled; a COMMIT the driver
// could not cut short, answered late) leaves nothing leased to the closed
// instance: Close gets an already-cancelled context, and the claim
// answers, its rows leased, only once its context has ended. Both claims
// of a poll: events, and the deliveries of split events.
func testCloseAfterALateClaim(t *testing.T, e *env) {
	ids := e.insertRows(t, 20, "", 0)
	claimed := make(chan struct{}, 1)
	st := hooked(e.store)
	st.claim = func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
		return e.store.Claim(answerLate(ctx, claimed), req)
	}
	for _, byOwner := range []bool{false, true} {
		e.closeAfterLateClaim(t, st, byOwner, claimed)
		stranded := 0
		for _, id := range ids {
			if rec := e.inspect(t, id); rec.Owner != "" {
				stranded++
			}
		}
		if stranded > 0 {
			t.Fatalf("%d of %d events left leased to the closed instance after a claim that answered late (released by owner: %v); want 0", stranded, len(ids), byOwner)
		}
	}
}

func testCloseAfterALateDeliveryClaim(t *testing.T, e *env) {
	ctx := context.Background()
	ids := e.insertRows(t, 20, "setup", time.Minute)
	for _, id := range ids {
		if ok, err := splitOne(ctx, e.ds(), "setup", id, []driver.DeliveryWrite{{Subscription: "all", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	claimed := make(chan struct{}, 1)
	st := hooked(e.store)
	st.claimDeliveries = func(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
		return e.ds().ClaimDeliveries(answerLate(ctx, claimed), req, subs, f)
	}
	for _, byOwner := range []bool{false, true} {
		e.closeAfterLateClaim(t, st, byOwner, claimed)
		stranded := 0
		for _, id := range ids {
			rec := e.inspect(t, id)
			if len(rec.Deliveries) != 1 {
				t.Fatalf("event %s: %d deliveries; want 1", id, len(rec.Deliveries))
			}
			if d := rec.Deliveries[0]; d.Owner != "" {
				stranded++
			} else if d.Attempts != 0 {
				t.Errorf("event %s: %d attempts after a cancelled delivery; want 0", id, d.Attempts)
			}
		}
		if stranded > 0 {
			t.Fatalf("%d of %d deliveries left leased to the closed instance after a claim that answered late (released by owner: %v); want 0", stranded, len(ids), byOwner)
		}
	}
}

// answerLate signals claimed, waits for ctx, a claim's, to end, and
// returns the context in which the claim is made all the same.
func answerLate(ctx context.Context, claimed chan<- struct{}) context.Context {
	select {
	case claimed <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return context.WithoutCancel(ctx)
}

// closeAfterLateClaim starts an instance over st, whose claim signals
// claimed and answers late, and closes it with a cancelled context once
// that claim is under way. With byOwner, Close may release by owner
// (driver.OwnerReleaser, if the store has it), else only by id.
func (e *env) closeAfterLateClaim(t *testing.T, st *hookedStore, byOwner bool, claimed <-chan struct{}) {
	t.Helper()
	cfg := fastConfig()
	cfg.StatsInterval = -1
	cfg.InstanceID = fmt.Sprintf("late-claimer-%v", byOwner)
	ob := e.outboxOn(t, st.releasingByOwner(byOwner), cfg)
	ob.Handle("all", func(ctx context.Context, _ outbox.Event) error { <-ctx.Done(); return ctx.Err() })
	start(t, ob)
	<-claimed
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // hand back at once, do not drain
	if err := ob.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// An event committed after its outbox was closed, or published through a
// closed outbox, is delivered by another instance at once, not after the
// publisher's lease.
func testCommitAfterClose(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Lease = time.Minute // what the events would wait without the fix
	closing := e.outbox(t, cfg)
	closing.Handle("all", func(context.Context, outbox.Event) error {
		t.Error("the closed instance delivered")
		return nil
	})

	start(t, closing)
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	committedLate, err := closing.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	closeNow(t, closing)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	afterClose := e.publish(t, closing, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	for _, id := range []string{committedLate, afterClose} {
		if rec := e.inspect(t, id); rec.Owner != "" {
			t.Errorf("event %s still leased to %q after its outbox closed", id, rec.Owner)
		}
	}
	rec := newRecorder(2)
	other := e.outbox(t, fastConfig())
	other.Handle("all", rec.listen)
	start(t, other)
	rec.wait(t, 5*time.Second) // far less than the minute-long lease
}
