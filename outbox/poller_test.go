package outbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

func TestMain(m *testing.M) { leakMain(m) }

// clockStore is a Store that records when Claim is called and hands out
// rows from a fixed supply. It exists to test the poller's timing; the
// real stores are tested by outbox/storetest.
type clockStore struct {
	nopDeliveries
	mu     sync.Mutex
	claims []time.Duration
	skips  []time.Duration // each claim's SkipRecent
	start  time.Time
	supply int
}

func (s *clockStore) Insert(context.Context, driver.Execer, *driver.Row, string, time.Duration) error {
	return nil
}
func (s *clockStore) Claim(_ context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims = append(s.claims, time.Since(s.start))
	s.skips = append(s.skips, req.SkipRecent)
	n := min(req.Limit, s.supply)
	s.supply -= n
	rows := make([]driver.Row, n)
	for i := range rows {
		rows[i] = driver.Row{ID: NewID(), Type: "T", Payload: []byte("x")}
	}
	return rows, nil
}
func (s *clockStore) MarkDone(_ context.Context, _ string, ids []string, registry int64) (int, error) {
	return len(ids), nil
}
func (s *clockStore) MarkRetry(context.Context, string, string, time.Duration, string) (bool, error) {
	return true, nil
}
func (s *clockStore) MarkDead(context.Context, string, string, string) (bool, error) {
	return true, nil
}
func (s *clockStore) ExtendLeases(_ context.Context, _ string, ids []string, _ time.Duration) (int, error) {
	return len(ids), nil
}
func (s *clockStore) Release(context.Context, string, []string, time.Duration) error { return nil }

func (s *clockStore) times() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.claims)
}

// An idle poller doubles its wait up to PollMaxInterval (here without
// its jitter; TestIdlePollersDoNotStayInStep has it); a hot-queue
// overflow wakes it at once and resets the back-off.
func TestPollerIdleBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &clockStore{start: time.Now()}
		ob, err := New(st, Config{PollInterval: time.Second, PollMaxInterval: 8 * time.Second, HotQueueSize: 1, Workers: 1, StatsInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ob.Close(context.Background()) })
		release := make(chan struct{})
		ob.Handle("all", func(context.Context, Event) error { <-release; return nil })
		ob.poller.jitter = func(time.Duration) time.Duration { return 0 } // exact times below
		ob.Start(context.Background())
		time.Sleep(30 * time.Second)
		synctest.Wait()
		want := []time.Duration{0, 1, 3, 7, 15, 23}
		for i := range want {
			want[i] *= time.Second
		}
		if got := st.times(); !slices.Equal(got, want) {
			t.Fatalf("claims at %v, want %v", got, want)
		}
		// Overflow the hot queue (one worker busy, one event queued, one
		// dropped): the poller wakes at once.
		for i := range 3 {
			ob.enqueueHot(Envelope{ID: NewID(), Type: "T", JSON: []byte{'1' + byte(i)}}, time.Now())
			synctest.Wait()
		}
		if got := st.times(); len(got) != 7 || got[6] != 30*time.Second {
			t.Fatalf("claims at %v, want one at 30s right after the overflow", got)
		}
		// That claim takes the released event however young it is; the
		// idle claims before it kept SkipRecent.
		st.mu.Lock()
		skips := slices.Clone(st.skips)
		st.mu.Unlock()
		for i, sk := range skips[:6] {
			if sk != DefaultSkipRecent {
				t.Fatalf("idle claim %d with SkipRecent %v, want %v", i, sk, DefaultSkipRecent)
			}
		}
		if skips[6] >= 0 {
			t.Fatalf("the claim after the overflow has SkipRecent %v; want none (negative), so the dropped event goes out at once", skips[6])
		}
		// The released event is younger than SkipRecent (1s): the poller
		// comes back for it then, not after its idle back-off.
		time.Sleep(time.Second)
		synctest.Wait()
		if got := st.times(); len(got) != 8 || got[7] != 31*time.Second {
			t.Fatalf("claims at %v, want one at 31s, once the overflowed event is due", got)
		}
		close(release)
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
}

// A full batch is followed by another poll at once; the cycle is skipped
// while the cold queue has no room.
func TestPollerDrainsBacklogAndSkipsWhenColdQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &clockStore{start: time.Now(), supply: 10}
		ob, err := New(st, Config{PollInterval: time.Second, PollBatchSize: 4, ColdQueueSize: 8, StatsInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ob.Close(context.Background()) })
		release := make(chan struct{})
		ob.Handle("all", func(context.Context, Event) error { <-release; return nil })
		// Not started: nothing drains the cold queue.
		ctx := context.Background()
		for _, want := range []int{4, 4, 0} {
			n, err := ob.Poll(ctx)
			if err != nil || n != want {
				t.Fatalf("Poll = %d, %v; want %d", n, err, want)
			}
		}
		if got := len(st.times()); got != 2 {
			t.Fatalf("%d claims; the third poll should have skipped the database", got)
		}
		ob.Start(ctx)
		// The loop polls at once, finds 2 left (less than a batch), then
		// backs off.
		time.Sleep(500 * time.Millisecond)
		close(release)
		synctest.Wait()
		if got := st.times(); len(got) < 3 || got[2] != 0 {
			t.Fatalf("claims at %v; want a claim right at start", got)
		}
		if err := ob.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// releaseStore records the ids passed to Release.
type releaseStore struct {
	clockStore
	mu       sync.Mutex
	released []string
}

func (s *releaseStore) Release(_ context.Context, _ string, ids []string, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = append(s.released, ids...)
	return nil
}

func (s *releaseStore) releasedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.released)
}

// Events dropped from a full hot queue are released within a poll interval
// even while the cold queue is full and the poller skips its claims, so
// that another instance can take them; an event already queued here is
// not dropped again.
func TestPollerReleasesDroppedWhileColdQueueFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &releaseStore{clockStore: clockStore{start: time.Now(), supply: 2}}
		ob, err := New(st, Config{PollInterval: time.Second, PollBatchSize: 2, ColdQueueSize: 2, HotQueueSize: 1, Workers: 1, StatsInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		t.Cleanup(func() { close(release); ob.Close(context.Background()) })
		ob.Handle("all", func(context.Context, Event) error { <-release; return nil })
		// Fill the cold queue (not started yet, so nothing takes from it).
		if n, err := ob.Poll(context.Background()); n != 2 || err != nil {
			t.Fatalf("Poll = %d, %v; want 2", n, err)
		}
		ob.Start(context.Background())
		synctest.Wait() // the worker holds one cold event, one is queued: too little room for a claim
		claims := len(st.times())
		busy := NewID()
		ob.enqueueHot(Envelope{ID: busy, Type: "T", JSON: []byte("1")}, time.Now()) // fills the hot queue
		dropped := NewID()
		ob.enqueueHot(Envelope{ID: dropped, Type: "T", JSON: []byte("2")}, time.Now()) // dropped
		ob.enqueueHot(Envelope{ID: busy, Type: "T", JSON: []byte("1")}, time.Now())    // already here: ignored
		time.Sleep(time.Second)
		synctest.Wait()
		if got := st.releasedIDs(); !slices.Equal(got, []string{dropped}) {
			t.Fatalf("released %v; want only the dropped event %s", got, dropped)
		}
		if got := len(st.times()); got != claims {
			t.Fatalf("%d claims while the cold queue was full; want none", got-claims)
		}
	})
}
