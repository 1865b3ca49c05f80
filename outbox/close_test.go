package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// hangingStore is the in-memory store whose writes, once hang is set,
// wait for their context to end and fail, as over a connection to a
// database that stopped answering.
type hangingStore struct {
	*outboxtest.Store
	hang  atomic.Bool
	calls atomic.Int32 // writes that hung

	// deaf, if set, makes the call named deafOn ignore its context: it
	// returns once deaf is closed, as a MySQL COMMIT on a connection that
	// stopped answering.
	deaf    chan struct{}
	deafOn  string
	deafNow atomic.Bool // the deaf call is waiting
}

// deafCall waits for deaf if the call named is the deaf one and the store
// hangs; it reports whether it did.
func (s *hangingStore) deafCall(name string) bool {
	if !s.hang.Load() || s.deaf == nil || s.deafOn != name {
		return false
	}
	s.calls.Add(1)
	s.deafNow.Store(true)
	<-s.deaf
	return true
}

func (s *hangingStore) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	if s.deafCall("Split") {
		return nil, errors.New("connection reset")
	}
	return s.Store.Split(ctx, owner, splits, registry)
}

func (s *hangingStore) wait(ctx context.Context) error {
	s.calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

func (s *hangingStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	if s.hang.Load() {
		return 0, s.wait(ctx)
	}
	return s.Store.MarkDone(ctx, owner, ids, registry)
}

func (s *hangingStore) Release(ctx context.Context, owner string, ids []string, delay time.Duration) error {
	if s.hang.Load() {
		return s.wait(ctx)
	}
	return s.Store.Release(ctx, owner, ids, delay)
}

func (s *hangingStore) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	if s.hang.Load() {
		return 0, s.wait(ctx)
	}
	return s.Store.ReleaseOwner(ctx, owner)
}

func (s *hangingStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if s.deafCall("Claim") {
		return nil, errors.New("connection reset")
	}
	if s.hang.Load() {
		return nil, s.wait(ctx)
	}
	return s.Store.Claim(ctx, req)
}

func (s *hangingStore) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	if s.hang.Load() {
		return 0, s.wait(ctx)
	}
	return s.Store.ExtendLeases(ctx, owner, ids, lease)
}

// TestCloseReturnsInTimeWhenTheDatabaseHangs: the database stops answering
// while one event is in the handler and two are queued behind it; Close,
// given 2 s, drains them and must then write their DONE, which hangs. It
// returns within its context and the grace periods (not after the engine's
// 15 s store timeout per write), and nothing is lost: the events, still
// leased to the closed instance, go to the next one once the lease ran out.
func TestCloseReturnsInTimeWhenTheDatabaseHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &hangingStore{Store: outboxtest.NewStore()}
		entered, release := make(chan struct{}), make(chan struct{})
		var first sync.Once
		var mu sync.Mutex
		var firstGot []string
		ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Workers: 1, Lease: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "proj", Handler: func(ctx context.Context, ev outbox.Event) error {
			first.Do(func() {
				close(entered)
				<-release
			})
			mu.Lock()
			firstGot = append(firstGot, ev.ID)
			mu.Unlock()
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for i := range 3 {
			ids = append(ids, publishKey(t, ob, st.Store, "A"+string(rune('0'+i)), i))
		}
		<-entered
		synctest.Wait()
		st.hang.Store(true)
		close(release)

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		closeErr := ob.Close(ctx)
		took := time.Since(start)
		if closeErr != nil {
			t.Errorf("Close: %v", closeErr)
		}
		// 2 s of context, then at most a grace period (1 s) for the
		// writes in progress, one for the parts and handler calls, and
		// the last release's own bound (5 s).
		if took > 9*time.Second {
			t.Errorf("Close took %v with a 2 s context while the database hung; want at most 9 s", took)
		}
		if st.calls.Load() == 0 {
			t.Fatal("no write hung: the test did not reach the database while it hung")
		}
		mu.Lock()
		if len(firstGot) != 3 {
			t.Errorf("the closed instance delivered %d of 3 events before its DONE write hung", len(firstGot))
		}
		mu.Unlock()

		// The database answers again; the events, never recorded DONE,
		// are still leased to the closed instance: the next one gets them
		// once the lease ran out.
		st.hang.Store(false)
		var got []string
		next, err := outbox.New(st, outbox.Config{InstanceID: "b", Lease: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Subscribe(outbox.Subscription{Name: "proj", Handler: func(ctx context.Context, ev outbox.Event) error {
			mu.Lock()
			got = append(got, ev.ID)
			mu.Unlock()
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
		if err := next.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer next.Close(context.Background())
		for range 30 {
			settle(time.Second)
			mu.Lock()
			n := len(got)
			mu.Unlock()
			if n == len(ids) {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		slices.Sort(got)
		want := slices.Sorted(slices.Values(ids))
		if !slices.Equal(got, want) {
			t.Errorf("after the lease ran out, the next instance delivered %v; want %v", got, want)
		}
	})
}

// A database call that ignores its context (a MySQL COMMIT on a
// connection that stopped answering cannot be cut short) holds a part of
// the engine during Close (the poller in its claim, a worker recording a
// failure): Close still returns in time, with an error naming the part it
// gave up waiting for, and that goroutine ends on its own when the call
// returns, without writing to what Close has closed.
func TestCloseGivesUpOnADatabaseCallThatIgnoresItsContext(t *testing.T) {
	for _, c := range []struct{ call, part string }{{"Claim", "poller"}, {"Split", "workers"}} {
		t.Run(c.part, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := &hangingStore{Store: outboxtest.NewStore(), deaf: make(chan struct{}), deafOn: c.call}
				ob, err := outbox.New(st, outbox.Config{InstanceID: "a", PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Subscribe(outbox.Subscription{Name: "proj", Handler: func(context.Context, outbox.Event) error {
					return errors.New("projection store down")
				}}); err != nil {
					t.Fatal(err)
				}
				if err := ob.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				st.hang.Store(true)
				if c.call == "Split" {
					publishKey(t, ob, st.Store, "A", 1) // fails; recording it hangs
					publishKey(t, ob, st.Store, "B", 2)
				}
				for st.calls.Load() == 0 || (c.call == "Split" && !st.deafNow.Load()) {
					settle(100 * time.Millisecond)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				start := time.Now()
				err = ob.Close(ctx)
				// 2 s of context, a grace period for the writes, one for
				// the parts, and the last release's bound (5 s).
				if took := time.Since(start); took > 9*time.Second {
					t.Errorf("Close took %v with a 2 s context while a database call ignored it", took)
				}
				if err == nil || !strings.Contains(err.Error(), c.part) {
					t.Errorf("Close = %v; want an error naming the %s, still in its database call", err, c.part)
				}
				close(st.deaf) // the call returns: the goroutine ends (synctest fails the test if it does not)
				synctest.Wait()
			})
		})
	}
}

// slowStore is the in-memory store whose completion writes and
// subscription syncs, once slow is set, wait for their context to end
// and return lag after it: calls that honour cancellation, on a machine
// too loaded to return at once (SQLite's do; its busy handler gives up
// when the context ends).
type slowStore struct {
	*outboxtest.Store
	slow    atomic.Bool
	lag     time.Duration
	waiting atomic.Int32 // calls waiting for their context
}

func (s *slowStore) late(ctx context.Context) error {
	s.waiting.Add(1)
	<-ctx.Done()
	time.Sleep(s.lag)
	return ctx.Err()
}

func (s *slowStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	if s.slow.Load() {
		return 0, s.late(ctx)
	}
	return s.Store.MarkDone(ctx, owner, ids, registry)
}

func (s *slowStore) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	if s.slow.Load() {
		return driver.Registration{}, s.late(ctx)
	}
	return s.Store.SyncSubscriptions(ctx, subs)
}

// A part whose database call honours its context, but returns a little
// late (a loaded machine), is not reported as blocked in a call that
// ignores it, however late in Close its turn to stop comes: the
// completer's DONE write and the registrar's sync wait on the database
// when Close, given a cancelled context, reaches them after the engine's
// life has ended; both return 150 ms after their context did.
func TestCloseWaitsForPartsThatHonourCancellationLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowStore{Store: outboxtest.NewStore(), lag: 150 * time.Millisecond}
		ob, err := outbox.New(st, outbox.Config{InstanceID: "a", Workers: 1, PollInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "proj", Handler: func(context.Context, outbox.Event) error { return nil }}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		st.slow.Store(true)
		id := publishKey(t, ob, st.Store, "A", 1)
		for st.waiting.Load() < 2 { // the DONE write and a sync
			settle(50 * time.Millisecond)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		if err := ob.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("Close took %v with a cancelled context", took)
		}
		settle(time.Second) // a part Close gave up on returns meanwhile
		// Its DONE never written, the event is handed back at once.
		if rec, err := st.Inspect(context.Background(), id); err != nil || rec.Owner != "" {
			t.Errorf("event %s: owner %q (%v) after Close; want none", id, rec.Owner, err)
		}
	})
}
