package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// dueStore is a Store holding rows with due times on the (fake) clock:
// Claim takes free rows that are due, MarkRetry makes a row due again
// after its delay. It exists to test when the engine retries; the real
// stores are tested by outbox/storetest.
type dueStore struct {
	clockStore
	mu    sync.Mutex
	rows  map[string]*dueRow
	polls []time.Time // when Claim was called
}

type dueRow struct {
	due              time.Time
	leased, finished bool
	split            bool
	attempts         int
}

func (s *dueStore) Claim(_ context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls = append(s.polls, time.Now())
	var out []driver.Row
	for id, r := range s.rows {
		if len(out) < req.Limit && !r.split && !r.leased && !r.finished && !r.due.After(time.Now()) {
			r.leased = true
			out = append(out, driver.Row{ID: id, Type: "T", Payload: []byte("x"), Attempts: r.attempts})
		}
	}
	return out, nil
}

// Split and FailDelivery keep one delivery per event: the test has one
// subscription.
func (s *dueStore) Split(_ context.Context, _ string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := make([]bool, len(splits))
	for i, sp := range splits {
		r, ws := s.rows[sp.EventID], sp.Writes
		r.split = true
		r.due, r.leased, r.attempts = time.Now().Add(ws[0].Delay), false, ws[0].Attempts
		held[i] = true
	}
	return held, nil
}

func (s *dueStore) FailDelivery(_ context.Context, _ string, k driver.DeliveryID, w driver.DeliveryWrite) (bool, error) {
	_, err := s.Split(context.Background(), "", []driver.EventSplit{{EventID: k.EventID, Writes: []driver.DeliveryWrite{w}}}, 0)
	return true, err
}

func (s *dueStore) ClaimDeliveries(_ context.Context, req driver.ClaimRequest, subs []string, _ driver.OrderFilter) ([]driver.Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []driver.Delivery
	for id, r := range s.rows {
		if len(out) < req.Limit && r.split && !r.leased && !r.finished && !r.due.After(time.Now()) {
			r.leased = true
			out = append(out, driver.Delivery{Row: driver.Row{ID: id, Type: "T", Payload: []byte("x"), Attempts: r.attempts}, Subscription: subs[0]})
		}
	}
	return out, nil
}

func (s *dueStore) CompleteDeliveries(_ context.Context, _ string, keys []driver.DeliveryID) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		s.rows[k.EventID].finished = true
	}
	return len(keys), nil
}

func (s *dueStore) MarkDone(_ context.Context, _ string, ids []string, registry int64) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.rows[id].finished = true
	}
	return len(ids), nil
}

// A retry runs at its back-off, not at the next poll: with a 5 s poll
// interval, attempts 2, 3 and 4 come 200, 400 and 800 ms after the failure
// before them, within a few milliseconds.
func TestRetriesRunOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &dueStore{rows: map[string]*dueRow{"e1": {due: time.Now()}}}
		ob, err := New(st, Config{
			PollInterval: 5 * time.Second, StatsInterval: -1, CompletionLinger: -1,
			Retry: RetryFunc(func(n int) time.Duration { return 200 * time.Millisecond << (n - 1) }),
		})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var at []time.Time
		done := make(chan struct{})
		ob.Handle("all", func(_ context.Context, ev Event) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			if ev.Attempt < 4 {
				return errors.New("downstream failed")
			}
			close(done)
			return nil
		})

		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		<-done
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(at); i++ {
			want := 200 * time.Millisecond << (i - 1)
			if got := at[i].Sub(at[i-1]); got < want || got > want+50*time.Millisecond {
				t.Errorf("attempt %d came %v after attempt %d; want %v (+50ms at most)", i+1, got, i, want)
			}
		}
	})
}

// Full, the wake-ups keep the earliest due times: an earlier one takes
// the place of the latest, a later one is left to the poll.
func TestRetryWakesKeepTheEarliestWhenFull(t *testing.T) {
	w := newRetryWakes()
	defer w.timer.Stop()
	base := time.Now().Add(time.Hour).Truncate(wakeGrain) // kept as it is
	for i := range maxRetryWakes {
		w.add(base.Add(time.Duration(i+1) * time.Second))
	}
	w.add(base.Add(time.Duration(maxRetryWakes+5) * time.Second)) // later than all: left
	w.add(base)                                                   // earlier than all: kept
	if len(w.dues) != maxRetryWakes {
		t.Fatalf("%d due times kept; want %d", len(w.dues), maxRetryWakes)
	}
	latest := w.dues[0]
	for _, d := range w.dues {
		if d.After(latest) {
			latest = d
		}
	}
	if !w.dues[0].Equal(base) || !latest.Equal(base.Add(time.Duration(maxRetryWakes-1)*time.Second)) {
		t.Errorf("kept %v … %v; want %v … %v (the earliest %d)", w.dues[0], latest, base, base.Add(time.Duration(maxRetryWakes-1)*time.Second), maxRetryWakes)
	}
}

// Retries decided a millisecond apart fall due a millisecond apart; the
// poller wakes for them once a wakeGrain, not once each (it polled 67
// times for these 200 retries before), and each retry still runs within
// two grains of its due time (rounded up to one, then claimed).
func TestRetriesDueApartWakeThePollerOncePerGrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 200
		st := &dueStore{rows: map[string]*dueRow{}}
		for i := range n {
			st.rows[fmt.Sprintf("e%03d", i)] = &dueRow{due: time.Now()}
		}
		ob, err := New(st, Config{
			PollInterval: 5 * time.Second, PollBatchSize: n, StatsInterval: -1, CompletionLinger: -1, Workers: 1,
			Retry: RetryFunc(func(int) time.Duration { return time.Second }),
		})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		failed, late := map[string]time.Time{}, time.Duration(0)
		var retried sync.WaitGroup
		retried.Add(n)
		ob.Handle("all", func(_ context.Context, ev Event) error {
			mu.Lock()
			defer mu.Unlock()
			if ev.Attempt == 1 {
				time.Sleep(time.Millisecond) // the next failure a millisecond later
				failed[ev.ID] = time.Now()
				return errors.New("downstream failed")
			}
			late = max(late, time.Since(failed[ev.ID].Add(time.Second)))
			retried.Done()
			return nil
		})
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		retried.Wait()
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		defer st.mu.Unlock()
		first := st.polls[0].Add(time.Second) // the first retry's due time, about
		var woken int
		for _, at := range st.polls {
			if !at.Before(first) {
				woken++
			}
		}
		// n retries due over n ms, plus the grain they may spill into.
		if most := int((n*time.Millisecond+wakeGrain)/wakeGrain) + 1; woken > most {
			t.Errorf("%d polls for %d retries due over %v; want at most %d (one a %v)", woken, n, n*time.Millisecond, most, wakeGrain)
		}
		if most := 2 * wakeGrain; late > most {
			t.Errorf("a retry ran %v after its due time; want within %v", late, most)
		}
	})
}
