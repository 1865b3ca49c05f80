package outbox

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// cleanStore is a clockStore with a Cleanup that deletes from a fixed
// supply of old rows and records each call.
type cleanStore struct {
	clockStore
	mu    sync.Mutex
	old   int64
	calls []cleanCall
	fail  error
}

type cleanCall struct {
	at          time.Duration // since the test's start
	age         time.Duration // the olderThan passed
	limit       int
	includeDead bool
}

func (s *cleanStore) Cleanup(_ context.Context, olderThan time.Duration, limit int, includeDead bool) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, cleanCall{time.Since(s.start), olderThan, limit, includeDead})
	if s.fail != nil {
		return 0, s.fail
	}
	n := min(int64(limit), s.old)
	s.old -= n
	return n, nil
}

func (s *cleanStore) snapshot() []cleanCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

type cleanedMetrics struct {
	NopMetrics
	mu sync.Mutex
	n  int64
}

func (m *cleanedMetrics) Cleaned(n int64) { m.mu.Lock(); m.n += n; m.mu.Unlock() }

// The cleanup runs at Start, repeats its batch until less than a batch is
// left, runs again every CleanupInterval, and stops with Close.
func TestCleanupBatchesAndRepeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &cleanStore{old: 2500}
		st.start = time.Now()
		m := &cleanedMetrics{}
		ob, err := New(st, Config{Retention: 7 * 24 * time.Hour, CleanupBatchSize: 1000, CleanupInterval: time.Hour,
			DisablePoller: true, StatsInterval: -1, Metrics: m, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ob.Start(context.Background())
		synctest.Wait()
		calls := st.snapshot()
		if len(calls) != 3 {
			t.Fatalf("cleanup at start made %d calls, want 3 (1000, 1000, then 500 < a batch): %+v", len(calls), calls)
		}
		for _, c := range calls {
			if c.at != 0 || c.age != 7*24*time.Hour || c.limit != 1000 || c.includeDead {
				t.Fatalf("call %+v; want at start, rows older than the retention, batches of 1000, DONE only", c)
			}
		}
		if m.n != 2500 {
			t.Fatalf("Cleaned counted %d rows, want 2500", m.n)
		}
		st.mu.Lock()
		st.old = 10
		st.mu.Unlock()
		time.Sleep(time.Hour - time.Nanosecond)
		synctest.Wait()
		if n := len(st.snapshot()); n != 3 {
			t.Fatalf("%d calls before the interval, want 3", n)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		calls = st.snapshot()
		if len(calls) != 4 || calls[3].at != time.Hour {
			t.Fatalf("calls %+v; want a fourth, one interval after start", calls)
		}
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		if n := len(st.snapshot()); n != 4 {
			t.Fatalf("cleanup ran after Close: %d calls", n)
		}
	})
}

// CleanupDead is passed on, and a failing cleanup is retried at the next
// interval, not in a loop.
func TestCleanupDeadAndFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &cleanStore{fail: errors.New("database down")}
		st.start = time.Now()
		ob, err := New(st, Config{Retention: time.Hour, CleanupDead: true, CleanupInterval: time.Minute,
			DisablePoller: true, StatsInterval: -1, Logger: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ob.Start(context.Background())
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		calls := st.snapshot()
		if len(calls) != 2 || !calls[0].includeDead || calls[1].at != time.Minute {
			t.Fatalf("calls %+v; want one failed call at start and one a minute later, both with dead rows", calls)
		}
		ob.Close(context.Background())
	})
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
