package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The failure hooks of every kind of subscription (Handler, Batch, Tx)
// are called after the database has the outcome: OnRetry finds the
// delivery RETRY with the attempt that failed, OnDead finds it DEAD, each
// with the handler's error; nothing is called for the subscription that
// delivers.
func TestFailureHooksSeeTheirOutcomeCommitted(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			refused := errors.New("refused by the destination")
			type seen struct {
				hook              string
				attempt, attempts int
				status            outbox.Status
				err               error
			}
			var mu sync.Mutex
			calls := map[string][]seen{} // subscription → calls
			record := func(hook string) outbox.FailureHook {
				return func(ctx context.Context, f outbox.Failure) {
					status, attempts := storedState(t, st, f.Event.ID, f.Event.Subscription)
					mu.Lock()
					defer mu.Unlock()
					calls[f.Event.Subscription] = append(calls[f.Event.Subscription], seen{hook, f.Event.Attempt, attempts, status, f.Err})
				}
			}
			retry := outbox.RetryFunc(func(int) time.Duration { return 50 * time.Millisecond })
			sub := func(s outbox.Subscription) outbox.Subscription {
				s.MaxAttempts, s.Retry, s.OnRetry, s.OnDead = 2, retry, record("retry"), record("dead")
				return s
			}
			ob := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, PollMaxInterval: 20 * time.Millisecond},
				sub(outbox.Subscription{Name: "single", Handler: func(ctx context.Context, ev outbox.Event) error { return refused }}),
				sub(outbox.Subscription{Name: "batch", Batch: func(ctx context.Context, evs []outbox.Event) error { return refused }}),
				sub(outbox.Subscription{Name: "tx", Tx: func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error { return refused }}),
				sub(outbox.Subscription{Name: "fine", Handler: func(ctx context.Context, ev outbox.Event) error { return nil }}))
			id := publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", JSON: []byte(`{}`)})
			waitUntil(t, 30*time.Second, "two hook calls for each failing subscription", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(calls["single"]) >= 2 && len(calls["batch"]) >= 2 && len(calls["tx"]) >= 2
			})
			mu.Lock()
			defer mu.Unlock()
			for _, s := range []string{"single", "batch", "tx"} {
				want := []seen{{"retry", 1, 1, outbox.StatusRetry, refused}, {"dead", 2, 2, outbox.StatusDead, refused}}
				got := calls[s]
				if len(got) != 2 {
					t.Errorf("%s: hook calls %+v; want %+v", s, got, want)
					continue
				}
				for i := range want {
					g, w := got[i], want[i]
					if g.hook != w.hook || g.attempt != w.attempt || g.attempts != w.attempts || g.status != w.status || !errors.Is(g.err, refused) {
						t.Errorf("%s of %s: call %d was %s for attempt %d, seeing %v with %d attempts (error %v); want %s for attempt %d, seeing %v with %d (the write before the hook)",
							s, id, i+1, g.hook, g.attempt, g.status, g.attempts, g.err, w.hook, w.attempt, w.status, w.attempts)
					}
				}
			}
			if got := calls["fine"]; len(got) > 0 {
				t.Errorf("hooks called for the subscription that delivered: %+v", got)
			}
		})
	}
}

// storedState returns the status and attempts of event id for sub, as
// the database has them.
func storedState(t *testing.T, st *sqlstore.Store, id, sub string) (outbox.Status, int) {
	rec, err := st.Inspect(context.Background(), id)
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == sub {
			return d.Status, d.Attempts
		}
	}
	return rec.Status, rec.Attempts
}
