package sqlstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// renewalsDown is a store whose lease renewals fail while down is set,
// as for an instance cut off from the database.
type renewalsDown struct {
	*sqlstore.Store
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
// instance took it over and delivered it meanwhile, and a delivery from
// the queue would be a second one running at once (the simulation's seed
// 2281 and 4502: two events of one key in flight after a freeze).
func TestEventWhoseLeaseRanOutInTheQueueIsNotDeliveredThere(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			base := testdb.Store(t, testdb.Open(t, name))
			st := &renewalsDown{Store: base}
			ctx := context.Background()
			const lease = time.Second
			first, second := outbox.NewID(), outbox.NewID()
			var mu sync.Mutex
			calls := map[string][]string{}
			hold := make(chan struct{}) // closed: every call of a that waits on it returns
			start := func(inst string) *outbox.Outbox {
				cfg := outbox.Config{InstanceID: inst, Lease: lease, PollInterval: 50 * time.Millisecond, Workers: 1, SkipRecent: -1}
				cfg.Logger = slog.New(slog.DiscardHandler)
				ob, err := outbox.New(st, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ob.Handle("mail", func(ctx context.Context, ev outbox.Event) error {
					mu.Lock()
					calls[ev.ID] = append(calls[ev.ID], inst)
					mu.Unlock()
					if ev.ID == first && inst == "a" {
						<-hold // a's only worker is busy with the first event
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
			tx, err := outbox.BeginTx(ctx, base.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{first, second} {
				if _, err := a.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Mailed", JSON: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			waitRecord(t, base, first, "in a's handler", func(outbox.Record) bool {
				mu.Lock()
				defer mu.Unlock()
				return len(calls[first]) == 1
			})
			st.down.Store(true) // a's renewals fail from now on
			start("b")          // takes the second over once its lease ran out, and delivers it
			waitStatus(t, base, second, outbox.StatusDone)
			st.down.Store(false)
			// a's worker comes to the second event now. (Since calls end
			// before their lease may run out, a's call of the first event
			// was abandoned at its lease's end, and a may have claimed and
			// called it again: close releases every such call, so that
			// Close, which waits for abandoned calls, returns.)
			close(hold)
			waitStatus(t, base, first, outbox.StatusDone)
			a.Close(ctx) // every worker of a is done
			mu.Lock()
			defer mu.Unlock()
			if got := calls[second]; len(got) != 1 {
				t.Errorf("the second event was delivered by %v; want once (a's lease on it had run out when a's worker came to it)", got)
			}
		})
	}
}

// heldSplit is renewalsDown whose first Split waits until release is
// closed (the instance frozen, or the database slow, while it records a
// failure), and which counts the claims that returned the event watched.
type heldSplit struct {
	renewalsDown
	once     sync.Once
	held     atomic.Bool
	release  chan struct{}
	watch    atomic.Value // string: the event id whose claims are counted
	reclaims atomic.Int32 // claims that returned it while its Split was held
	claims   atomic.Int32 // claims since the first of those
}

func (s *heldSplit) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	s.once.Do(func() {
		s.held.Store(true)
		<-s.release
		s.held.Store(false)
	})
	return s.Store.Split(ctx, owner, splits, registry)
}

func (s *heldSplit) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	rows, err := s.Store.Claim(ctx, req)
	if s.reclaims.Load() > 0 {
		s.claims.Add(1)
	}
	for _, r := range rows {
		if id, _ := s.watch.Load().(string); r.ID == id && s.held.Load() {
			s.reclaims.Add(1)
		}
	}
	return rows, err
}

// An event whose failure is being recorded when its lease runs out (the
// write held up past the lease while no renewal succeeds) stays in the
// instance's hands until that write returns: the instance's own poll,
// which leases it again meanwhile (the database cannot tell the
// instance's old lease from its new one), does not deliver a second copy
// of it. Before, the event left the in-flight set before the write, and
// the poll delivered it again while the first outcome was being written
// (the simulation's seeds 345, 2926 and 3794; outbox's
// TestOutcomeWrittenAfterTheLeaseRanOutKeepsOneCopyInHand).
func TestOutcomeWrittenAfterTheLeaseRanOutKeepsOneCopyInHand(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			base := testdb.Store(t, testdb.Open(t, name))
			st := &heldSplit{renewalsDown: renewalsDown{Store: base}, release: make(chan struct{})}
			ctx := context.Background()
			var calls, duringWrite atomic.Int32
			ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Logger: slog.New(slog.DiscardHandler), Lease: time.Second,
				PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond, Workers: 2, SkipRecent: -1,
				Retry: outbox.ExponentialBackoff{Base: 10 * time.Millisecond, Max: 10 * time.Millisecond}})
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
			id := outbox.NewID()
			st.watch.Store(id)
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close(ctx) })
			tx, err := outbox.BeginTx(ctx, base.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "Mailed", JSON: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			st.down.Store(true) // no renewal succeeds: the lease runs out while the Split waits
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// The instance's polls lease the event again once its lease ran
			// out; five polls after the first that did, a second copy would
			// long have been delivered by the idle worker.
			deadline := time.Now().Add(30 * time.Second)
			for st.claims.Load() < 5 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if st.reclaims.Load() == 0 {
				t.Fatal("no poll leased the event again while its failure was being written")
			}
			if n := duringWrite.Load(); n != 0 {
				t.Errorf("the event was delivered %d more time(s) while its first failure was still being written; want none", n)
			}
			st.down.Store(false)
			close(st.release)
			waitStatus(t, base, id, outbox.StatusDone)
			if n := calls.Load(); n != 2 {
				t.Errorf("%d calls; want 2 (the failure, then its retry)", n)
			}
		})
	}
}

// A call whose lease may run out while it runs (no renewal succeeds) is
// cancelled before the lease ends, so that it has returned when another
// instance takes the event over: the two calls never run at once (the
// simulation's seed 30827; outbox's TestCallEndsBeforeItsLeaseMayRunOut).
// Before, the first call ran on to its 10 s timeout beside the second.
func TestCallEndsBeforeItsLeaseMayRunOut(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			base := testdb.Store(t, testdb.Open(t, name))
			st := &renewalsDown{Store: base}
			ctx := context.Background()
			const lease = time.Second
			var inFlight, overlaps, calls atomic.Int32
			var cut atomic.Bool
			start := func(inst string) *outbox.Outbox {
				cfg := outbox.Config{InstanceID: inst, Lease: lease, PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond, SkipRecent: -1}
				cfg.Logger = slog.New(slog.DiscardHandler)
				ob, err := outbox.New(st, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Subscribe(outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Timeout: 10 * time.Second,
					Handler: func(ctx context.Context, ev outbox.Event) error {
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
					}}); err != nil {
					t.Fatal(err)
				}
				if err := ob.Start(ctx); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ob.Close(ctx) })
				return ob
			}
			a := start("a")
			tx, err := outbox.BeginTx(ctx, base.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			id, err := a.PublishTx(ctx, tx, outbox.Envelope{Type: "Booked", AggregateType: "acct", AggregateID: "1", JSON: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			st.down.Store(true) // no renewal of a's lease succeeds from now on
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			start("b")
			waitStatus(t, base, id, outbox.StatusDone)
			if !cut.Load() {
				t.Error("the first call was not cancelled")
			}
			if n := overlaps.Load(); n != 0 {
				t.Errorf("%d call(s) of the event began while another was still running; want none (the first call ran past its lease)", n)
			}
		})
	}
}
