package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// renewalsDown is a store whose lease renewals fail while down is set:
// the database unreachable for the instance that renews.
type renewalsDown struct {
	*outboxtest.Store
	down atomic.Bool
}

func (s *renewalsDown) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	if s.down.Load() {
		return 0, errors.New("the database is unreachable")
	}
	return s.Store.ExtendLeases(ctx, owner, ids, lease)
}

// An event an instance holds in its queue while no renewal of its lease
// succeeds for a whole lease is not delivered there afterwards: another
// instance may have claimed it meanwhile (here one did, and delivered it),
// and two deliveries of it would run at once. Before, the instance
// delivered it from its queue all the same.
func TestEventWhoseLeaseRanOutInTheQueueIsNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := &renewalsDown{Store: outboxtest.NewStore()}
		const lease = time.Second
		first, second := outbox.NewID(), outbox.NewID()
		var mu sync.Mutex
		calls := map[string][]string{} // event id -> instances that delivered it
		release := make(chan struct{})
		start := func(name string) *outbox.Outbox {
			ob, err := outbox.New(st, outbox.Config{InstanceID: name, Logger: slog.New(slog.DiscardHandler), Lease: lease,
				PollInterval: 100 * time.Millisecond, Workers: 1, SkipRecent: -1})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("mail", func(ctx context.Context, ev outbox.Event) error {
				mu.Lock()
				calls[ev.ID] = append(calls[ev.ID], name)
				mu.Unlock()
				if ev.ID == first && name == "a" {
					<-release // a's only worker is busy with the first event
				}
				return nil
			})
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close(ctx) })
			return ob
		}
		a := start("a")
		tx := st.Begin(ctx)
		for _, id := range []string{first, second} {
			if _, err := a.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Mailed", JSON: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // a's worker is in the first event; the second waits in a's queue
		st.down.Store(true)
		time.Sleep(2 * lease) // no renewal of a's leases succeeds
		start("b")            // takes both over once their leases ran out
		time.Sleep(2 * lease)
		st.down.Store(false)
		close(release)
		time.Sleep(2 * lease)
		mu.Lock()
		defer mu.Unlock()
		if got := calls[second]; len(got) != 1 {
			t.Errorf("the second event was delivered by %v; want once (a's lease on it had run out when a's worker came to it)", got)
		}
	})
}

// heldSplit is a store whose first Split waits until release is closed
// (the instance frozen, or the database slow, while it records a failure),
// and whose lease renewals fail while down is set.
type heldSplit struct {
	renewalsDown
	once    sync.Once
	held    atomic.Bool
	release chan struct{}
}

func (s *heldSplit) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	s.once.Do(func() {
		s.held.Store(true)
		<-s.release
		s.held.Store(false)
	})
	return s.Store.Split(ctx, owner, splits, registry)
}

// An event whose failure is being recorded when its lease runs out (the
// write held up past the lease while no renewal succeeds) stays in this
// instance's hands until that write returns: the instance's own poll,
// which may lease it again meanwhile (the store cannot tell the old lease
// of an instance from its new one), does not queue a second copy of it.
// Before, the event left the in-flight set before the write, and the poll
// delivered it again while the first outcome was still being written (the
// simulation's seeds 345, 2926 and 3794: two calls of one key's events in
// flight to an ordered subscription on one instance, the old write then
// passing the key on beside the new call).
func TestOutcomeWrittenAfterTheLeaseRanOutKeepsOneCopyInHand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := &heldSplit{renewalsDown: renewalsDown{Store: outboxtest.NewStore()}, release: make(chan struct{})}
		const lease = time.Second
		var calls, duringWrite atomic.Int32
		ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Logger: slog.New(slog.DiscardHandler), Lease: lease,
			PollInterval: 100 * time.Millisecond, PollMaxInterval: 100 * time.Millisecond, Workers: 2, SkipRecent: -1})
		if err != nil {
			t.Fatal(err)
		}
		ob.Handle("mail", func(ctx context.Context, ev outbox.Event) error {
			if st.held.Load() {
				duringWrite.Add(1)
			}
			if calls.Add(1) == 1 {
				return errors.New("the mail server said no")
			}
			return nil
		})
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ob.Close(ctx)
		tx := st.Begin(ctx)
		id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Mailed", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the first call failed; its Split waits
		if !st.held.Load() {
			t.Fatal("the failure's Split was not called")
		}
		st.down.Store(true)
		time.Sleep(3 * lease) // the lease runs out; the instance's polls may lease it again
		synctest.Wait()
		if n := duringWrite.Load(); n != 0 {
			t.Errorf("the event was delivered %d more time(s) while its first failure was still being written; want none", n)
		}
		st.down.Store(false)
		close(st.release)
		time.Sleep(30 * time.Second) // the retry
		rec, err := st.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != outbox.StatusDone || calls.Load() != 2 {
			t.Errorf("after the write: event %v after %d calls; want DONE after 2 (the failure, then its retry)", rec.Status, calls.Load())
		}
	})
}

// A call whose lease may run out while it runs (no renewal succeeds: the
// database unreachable) has its context cancelled before the lease ends,
// so that it has returned when another instance takes the event over:
// two calls of one event never run at once. Before, the call ran on to
// its timeout (10 s here, past the 1 s lease), beside the other
// instance's call (the simulation's seed 30827: two calls of one event
// of an ordered key in flight on two instances, the first started with
// 0.62 s of its lease left and a 1.38 s timeout).
func TestCallEndsBeforeItsLeaseMayRunOut(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "Handler", true: "Batch"}[batch], func(t *testing.T) {
			testCallEndsBeforeItsLeaseMayRunOut(t, batch)
		})
	}
}

func testCallEndsBeforeItsLeaseMayRunOut(t *testing.T, batch bool) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := &renewalsDown{Store: outboxtest.NewStore()}
		const lease = time.Second
		var inFlight, overlaps, calls atomic.Int32
		var cut atomic.Bool
		handler := func(ctx context.Context) error {
			if inFlight.Add(1) > 1 {
				overlaps.Add(1)
			}
			defer inFlight.Add(-1)
			if calls.Add(1) > 1 {
				return nil // the other instance's call
			}
			<-ctx.Done() // the first call waits for its destination
			cut.Store(true)
			return ctx.Err()
		}
		start := func(name string) *outbox.Outbox {
			ob, err := outbox.New(st, outbox.Config{InstanceID: name, Logger: slog.New(slog.DiscardHandler), Lease: lease,
				PollInterval: 100 * time.Millisecond, PollMaxInterval: 100 * time.Millisecond, SkipRecent: -1})
			if err != nil {
				t.Fatal(err)
			}
			sub := outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Timeout: 10 * time.Second,
				Handler: func(ctx context.Context, ev outbox.Event) error { return handler(ctx) }}
			if batch {
				sub.Handler, sub.Batch = nil, func(ctx context.Context, evs []outbox.Event) error { return handler(ctx) }
			}
			if err := ob.Subscribe(sub); err != nil {
				t.Fatal(err)
			}
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close(ctx) })
			return ob
		}
		a := start("a")
		tx := st.Begin(ctx)
		id, err := a.PublishTx(ctx, tx, outbox.Envelope{Type: "Booked", AggregateType: "acct", AggregateID: "1", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		st.down.Store(true) // no renewal of a's lease succeeds from now on
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // a's call waits
		start("b")
		time.Sleep(5 * lease)
		st.down.Store(false)
		time.Sleep(5 * lease)
		if !cut.Load() {
			t.Error("the first call was not cancelled")
		}
		if n := overlaps.Load(); n != 0 {
			t.Errorf("%d call(s) of the event began while another was still running; want none (the first call ran past its lease)", n)
		}
		rec, err := st.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != outbox.StatusDone {
			t.Errorf("event %v after %d calls; want DONE", rec.Status, calls.Load())
		}
	})
}
