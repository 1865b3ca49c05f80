package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Engine cases: failed deliveries, retries and dead events.

// 18.4: a failing listener makes the event RETRY with growing attempts,
// then DEAD after MaxAttempts, with last_error capped at 4000 characters.
func testRetryThenDead(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.MaxAttempts = 3
	const backoff = 60 * time.Millisecond
	cfg.Retry = outbox.RetryFunc(func(failures int) time.Duration { return backoff })
	ob := e.outbox(t, cfg)
	type attempt struct {
		n     int
		start time.Time
	}
	attempts := make(chan attempt, 10)
	var lastEnd atomic.Int64
	gate := make(chan struct{})       // holds attempt 2 while the row is inspected
	long := strings.Repeat("é", 5000) // multi-byte: truncation must respect characters
	ob.Handle("listener-2", func(_ context.Context, ev outbox.Event) error {
		attempts <- attempt{ev.Attempt, time.Now()}
		if ev.Attempt == 2 {
			<-gate
		}
		lastEnd.Store(time.Now().UnixNano())
		return errors.New(long)
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	first := recv(t, attempts, "attempt 1")
	firstEnd := time.Unix(0, lastEnd.Load())
	second := recv(t, attempts, "attempt 2")
	if first.n != 1 || second.n != 2 {
		t.Fatalf("attempt numbers %d, %d; want 1, 2", first.n, second.n)
	}
	if gap := second.start.Sub(firstEnd); gap < backoff/2 {
		t.Fatalf("attempt 2 started %v after attempt 1 failed; the back-off is %v", gap, backoff)
	}
	// While attempt 2 runs, the row shows the first failure.
	rec := e.wantStatus(t, id, outbox.StatusRetry)
	if rec.Attempts != 1 {
		t.Fatalf("after one failure: status %v attempts %d, want retry 1", rec.Status, rec.Attempts)
	}
	if n := len([]rune(rec.LastError)); n > outbox.MaxErrorChars || n < 1000 {
		t.Fatalf("last_error has %d characters, want at most %d and the error's start", n, outbox.MaxErrorChars)
	}
	close(gate)
	if third := recv(t, attempts, "attempt 3"); third.n != 3 {
		t.Fatalf("attempt %d, want 3", third.n)
	}
	closeNow(t, ob)
	rec = e.wantStatus(t, id, outbox.StatusDead)
	if rec.Attempts != 3 {
		t.Fatalf("dead after %d attempts, want 3", rec.Attempts)
	}
	if n := len([]rune(rec.LastError)); n != outbox.MaxErrorChars {
		t.Fatalf("last_error has %d characters, want %d", n, outbox.MaxErrorChars)
	}
	select {
	case a := <-attempts:
		t.Fatalf("attempt %d after the event went dead", a.n)
	default:
	}
}

// A panicking and an always-failing listener go DEAD while 100 healthy
// events are delivered.
func testPanicAndFailing(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.MaxAttempts = 2
	ob := e.outbox(t, cfg)
	const healthy = 100
	rec := newRecorder(healthy)
	ob.Handle("listener-4", rec.listen, "Healthy")
	var badDone sync.WaitGroup
	badDone.Add(4) // two attempts each
	ob.Handle("listener-5", func(context.Context, outbox.Event) error { defer badDone.Done(); panic("listener bug") }, "Panics")
	ob.Handle("listener-6", func(context.Context, outbox.Event) error { defer badDone.Done(); return errAlwaysFails }, "Fails")
	start(t, ob)
	panicky := e.publish(t, ob, outbox.Envelope{Type: "Panics", JSON: []byte(payload)})
	failing := e.publish(t, ob, outbox.Envelope{Type: "Fails", JSON: []byte(payload)})
	ids := e.publishMany(t, ob, "Healthy", healthy)
	rec.wait(t, wait)
	waitGroup(t, &badDone, "the bad listeners' attempts")
	closeNow(t, ob)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if rec := e.wantStatus(t, panicky, outbox.StatusDead); !strings.Contains(rec.LastError, "panicked: listener bug") {
		t.Fatalf("panicking listener's last error %q", rec.LastError)
	}
	if rec := e.wantStatus(t, failing, outbox.StatusDead); !strings.Contains(rec.LastError, errAlwaysFails.Error()) {
		t.Fatalf("failing listener's last error %q", rec.LastError)
	}
}

// An error wrapped with outbox.Permanent is DEAD after one attempt.
func testPermanent(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	called := make(chan struct{}, 5)
	ob.Handle("listener-7", func(context.Context, outbox.Event) error {
		called <- struct{}{}
		return outbox.Permanent(errors.New("malformed order"))
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, called, "the attempt")
	closeNow(t, ob)
	if rec := e.wantStatus(t, id, outbox.StatusDead); rec.Attempts != 1 {
		t.Fatalf("attempts %d, want 1", rec.Attempts)
	}
	if len(called) != 0 {
		t.Fatalf("retried a permanent failure")
	}
}

// A listener that ignores its context is cut by the timeout: the worker
// moves on, the attempt fails, and Close still waits for the call.
func testListenerTimeout(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.MaxAttempts = 1
	cfg.ListenerTimeout = 50 * time.Millisecond
	ob := e.outbox(t, cfg)
	entered := make(chan struct{})
	release := make(chan struct{})
	var stuckReturned atomic.Bool
	ob.Handle("listener-8", func(context.Context, outbox.Event) error {
		close(entered)
		<-release
		stuckReturned.Store(true)
		return nil
	}, typeA)

	next := make(chan string, 1)
	ob.Handle("listener-9", func(_ context.Context, ev outbox.Event) error { next <- ev.ID; return nil }, typeB)
	start(t, ob)
	stuck := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, entered, "the stuck listener to start")
	after := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	// One worker: the second event can only be delivered once the worker
	// has given up on the first.
	if got := recv(t, next, "the next event"); got != after {
		t.Fatalf("delivered %s, want %s", got, after)
	}
	closed := make(chan error, 1)
	go func() { closed <- ob.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an abandoned listener call was still running", err)
	default:
	}
	close(release)
	if err := recv(t, closed, "Close"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !stuckReturned.Load() {
		t.Fatal("Close returned before the abandoned call")
	}
	if rec := e.wantStatus(t, stuck, outbox.StatusDead); !strings.Contains(rec.LastError, "did not return within") {
		t.Fatalf("last error %q", rec.LastError)
	}
}

// A stored row that cannot be decoded goes DEAD instead of looping.
func testUndecodable(t *testing.T, e *env) {
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := outbox.NewID()
	row := &driver.Row{ID: id, Type: string(typeA), Headers: []byte(`{"k": 1`), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
	if err := e.store.Insert(ctx, tx, row, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ob := e.outbox(t, fastConfig())
	ob.Handle("all", func(context.Context, outbox.Event) error {
		t.Error("listener called for an undecodable row")
		return nil
	})

	if _, err := ob.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := e.wantStatus(t, id, outbox.StatusDead); !strings.Contains(rec.LastError, "headers") {
		t.Fatalf("last error %q", rec.LastError)
	}
}

// A listener error the database cannot store as it is (invalid UTF-8, a
// NUL byte) is made storable: the attempts advance and the event goes DEAD
// after MaxAttempts with a readable last_error, instead of being delivered
// again every lease. An outcome write the database refuses outright is
// recorded without the text.
func testUnstorableErrorText(t *testing.T, e *env) {
	for _, tc := range []struct{ name, text string }{
		{"invalid UTF-8", "bad bytes \xff\xfe\xc3 from the broker"},
		{"NUL", "bad bytes \x00 from the broker"},
		{"refused", "refuse-me: bad bytes from the broker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := hooked(e.store)
			refuse := func(text string) error {
				if strings.Contains(text, "refuse-me") {
					return errors.New("storetest: the database refuses this text")
				}
				return nil
			}
			cfg := fastConfig()
			cfg.MaxAttempts = 3
			ob := e.outboxOn(t, st, cfg)
			var calls atomic.Int64
			ob.Handle("all", func(context.Context, outbox.Event) error {
				calls.Add(1)
				return errors.New(tc.text)
			})

			dead := make(chan struct{})
			var once sync.Once
			st.record = func(ctx context.Context, ws []driver.DeliveryWrite, write func() (bool, error)) (bool, error) {
				if err := refuse(ws[0].Error); err != nil {
					return false, err
				}
				if ws[0].Status == outbox.StatusDead {
					defer once.Do(func() { close(dead) })
				}
				return write()
			}
			start(t, ob)
			id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
			recv(t, dead, "the event going DEAD")
			closeNow(t, ob)
			rec := e.wantStatus(t, id, outbox.StatusDead)
			if rec.Attempts != 3 || calls.Load() != 3 {
				t.Fatalf("attempts %d, listener calls %d; want 3 and 3", rec.Attempts, calls.Load())
			}
			if !utf8.ValidString(rec.LastError) || strings.ContainsRune(rec.LastError, 0) || !strings.Contains(rec.LastError, "bad bytes") && !strings.Contains(rec.LastError, "could not be stored") {
				t.Fatalf("last_error %q: want readable text", rec.LastError)
			}
		})
	}
}

// A row claimed again while its previous attempt is still finishing on
// this instance (the retry written, the worker not yet done) is queued,
// not skipped with its new lease left to expire.
func testReclaimWhileFinishing(t *testing.T, e *env) {
	written, proceed := make(chan struct{}), make(chan struct{})
	st := hooked(e.store)
	st.record = func(ctx context.Context, _ []driver.DeliveryWrite, write func() (bool, error)) (bool, error) {
		ok, err := write()
		close(written)
		<-proceed
		return ok, err
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.SkipRecent = -1
	cfg.Retry = outbox.RetryFunc(func(int) time.Duration { return 0 }) // due again at once
	ob := e.outboxOn(t, st, cfg)
	second := make(chan outbox.Event, 1)
	var calls atomic.Int64
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		second <- ev
		return nil
	})

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, written, "the retry write")
	n, err := ob.Poll(context.Background())
	close(proceed)
	if err != nil || n != 1 {
		t.Fatalf("Poll while the first attempt finishes = %d, %v; want the event queued (1)", n, err)
	}
	if ev := recv(t, second, "the second attempt"); ev.ID != id || ev.Attempt != 2 {
		t.Fatalf("second delivery %s attempt %d", ev.ID, ev.Attempt)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
}

// A retry runs at its back-off, not at the next poll: with the default
// 5 s poll interval and retry policy (200 ms ×0.5–1.5), the second attempt
// comes within a second of the first.
func testRetryRunsOnTime(t *testing.T, e *env) {
	ob := e.outbox(t, outbox.Config{SkipRecent: -1})
	attempts := make(chan time.Time, 2)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
		attempts <- time.Now()
		if ev.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})

	start(t, ob)
	e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	first := recv(t, attempts, "the first attempt")
	second := recv(t, attempts, "the second attempt")
	if gap := second.Sub(first); gap > time.Second {
		t.Fatalf("second attempt %v after the first; want the back-off (≤ 300ms), within 1s", gap)
	}
}
