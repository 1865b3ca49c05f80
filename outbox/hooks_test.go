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
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

var errRefused = errors.New("refused by the destination")

// deliveryState returns the status and attempts of event id for sub, as
// the store has them: the delivery's of a split event, else the event's.
func deliveryState(t *testing.T, st *outboxtest.Store, id, sub string) (outbox.Status, int) {
	t.Helper()
	rec, err := st.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == sub {
			return d.Status, d.Attempts
		}
	}
	return rec.Status, rec.Attempts
}

// A failure hook is called after the write that records the failure: it
// sees the delivery RETRY (OnRetry) or DEAD (OnDead) in the store, with
// the attempt that failed, the handler's error and the wait before the
// next attempt. A subscription beside it that delivers calls no hook.
func TestFailureHooksRunAfterTheOutcomeIsRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		type seen struct {
			hook     string
			f        outbox.Failure
			status   outbox.Status
			attempts int
		}
		var mu sync.Mutex
		var calls []seen
		record := func(hook string) outbox.FailureHook {
			return func(ctx context.Context, f outbox.Failure) {
				status, attempts := deliveryState(t, st, f.Event.ID, f.Event.Subscription)
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, seen{hook, f, status, attempts})
			}
		}
		unexpected := func(ctx context.Context, f outbox.Failure) {
			t.Errorf("hook called for %s, which delivered", f.Event.Subscription)
		}
		ob := startedOutbox(t, st, outbox.Config{PollInterval: 100 * time.Millisecond, PollMaxInterval: 100 * time.Millisecond},
			outbox.Subscription{Name: "failing", MaxAttempts: 2, Retry: outbox.RetryFunc(func(int) time.Duration { return time.Second }),
				Handler: func(ctx context.Context, ev outbox.Event) error { return errRefused },
				OnRetry: record("retry"), OnDead: record("dead")},
			outbox.Subscription{Name: "fine", Handler: func(ctx context.Context, ev outbox.Event) error { return nil },
				OnRetry: unexpected, OnDead: unexpected})
		id := publishOneTo(t, ob, st)
		settle(5 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		if len(calls) != 2 {
			t.Fatalf("hook calls %+v; want one OnRetry, then one OnDead", calls)
		}
		r, d := calls[0], calls[1]
		if r.hook != "retry" || r.f.Event.ID != id || r.f.Event.Subscription != "failing" || r.f.Event.Attempt != 1 || r.f.RetryIn != time.Second || !errors.Is(r.f.Err, errRefused) {
			t.Errorf("first call %s %+v; want OnRetry of %s for failing, attempt 1, retry in 1s, the handler's error", r.hook, r.f, id)
		}
		if r.status != outbox.StatusRetry || r.attempts != 1 {
			t.Errorf("OnRetry saw the delivery %v with %d attempts; want RETRY with 1 (the write before the hook)", r.status, r.attempts)
		}
		if d.hook != "dead" || d.f.Event.Attempt != 2 || d.f.RetryIn != 0 || !errors.Is(d.f.Err, errRefused) {
			t.Errorf("second call %s %+v; want OnDead, attempt 2, no retry, the handler's error", d.hook, d.f)
		}
		if d.status != outbox.StatusDead || d.attempts != 2 {
			t.Errorf("OnDead saw the delivery %v with %d attempts; want DEAD with 2", d.status, d.attempts)
		}
	})
}

// publishOneTo publishes one event of type Changed in a transaction of
// its own.
func publishOneTo(t *testing.T, ob *outbox.Outbox, st *outboxtest.Store) string {
	t.Helper()
	return publishEnv(t, ob, st, outbox.Envelope{Type: "Changed", JSON: []byte(`{}`)})
}

// hookDrops counts Metrics.HookDropped.
type hookDrops struct {
	outbox.NopMetrics
	n atomic.Int64
}

func (m *hookDrops) HookDropped(string) { m.n.Add(1) }

// A hook that does not return never holds up delivery: every event goes
// dead on time while the first call hangs, the calls past the queue's
// room are dropped and counted, and those queued run once it returns.
// A panicking hook is contained: the next call is made.
func TestSlowFailureHookNeverHoldsUpDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		m := &hookDrops{}
		release := make(chan struct{})
		var called atomic.Int64
		hook := func(ctx context.Context, f outbox.Failure) {
			if called.Add(1) == 1 {
				<-release // ignores ctx: a hook that hangs
				panic("the hook fails too")
			}
		}
		ob, err := outbox.New(st, outbox.Config{Metrics: m, Logger: slog.New(slog.DiscardHandler), PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "failing", MaxAttempts: 1,
			Handler: func(ctx context.Context, ev outbox.Event) error { return errRefused }, OnDead: hook}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		const n = 1100 // more than the queue holds (1,024) with one call hanging
		ids := make([]string, n)
		for i := range ids {
			ids[i] = publishOneTo(t, ob, st)
		}
		settle(30 * time.Second)
		for _, id := range ids {
			if status, _ := deliveryState(t, st, id, "failing"); status != outbox.StatusDead {
				t.Fatalf("event %s is %v while a hook hangs; want DEAD (a hook must not hold up delivery)", id, status)
			}
		}
		if d := m.n.Load(); d < n-1025 || d > n-1024 {
			t.Errorf("%d hook calls dropped; want %d or %d (those past the queue's room)", d, n-1025, n-1024)
		}
		close(release)
		if err := ob.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := called.Load() + m.n.Load(); got != n {
			t.Errorf("%d hook calls made and %d dropped; want %d in all (the queued ones run after the panic)", called.Load(), m.n.Load(), n)
		}
	})
}

// Close lets the queued hook calls run while its context lasts; once it
// ends, the calls' context is cancelled, the rest are dropped (counted),
// and Close returns.
func TestCloseBoundsTheFailureHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		m := &hookDrops{}
		var called atomic.Int64
		hook := func(ctx context.Context, f outbox.Failure) {
			called.Add(1)
			<-ctx.Done() // a hook that takes as long as it may
		}
		ob, err := outbox.New(st, outbox.Config{Metrics: m, Logger: slog.New(slog.DiscardHandler), PollInterval: 50 * time.Millisecond, PollMaxInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "failing", MaxAttempts: 1, Timeout: time.Minute,
			Handler: func(ctx context.Context, ev outbox.Event) error { return errRefused }, OnDead: hook}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			publishOneTo(t, ob, st)
		}
		settle(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := ob.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 11*time.Second {
			t.Errorf("Close took %v; want its context's 10s (a hook's own Timeout is a minute)", took)
		}
		if called.Load() != 1 || m.n.Load() != 2 {
			t.Errorf("%d hook calls made, %d dropped; want 1 (cut at Close's deadline) and 2", called.Load(), m.n.Load())
		}
	})
}
