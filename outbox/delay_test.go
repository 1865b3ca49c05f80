package outbox_test

import (
	"context"
	"errors"
	"log/slog"
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

// arrivals records when each event reached the handler, and its path.
type arrivals struct {
	mu    sync.Mutex
	at    map[string]time.Time
	path  map[string]outbox.Path
	order []string
}

func (a *arrivals) handle(ctx context.Context, ev outbox.Event) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at == nil {
		a.at, a.path = map[string]time.Time{}, map[string]outbox.Path{}
	}
	a.at[ev.ID], a.path[ev.ID] = time.Now(), ev.Path
	a.order = append(a.order, ev.ID)
	return nil
}

func (a *arrivals) when(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

func publishEnv(t *testing.T, ob *outbox.Outbox, st *outboxtest.Store, env outbox.Envelope) string {
	t.Helper()
	ctx := context.Background()
	tx := st.Begin(ctx)
	id, err := ob.PublishTx(ctx, tx, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// A delayed event is delivered at its NotBefore, not before, and not
// from memory: with the poll an hour away, the instance that published
// it wakes its poller at the due time.
func TestDelayedEventIsDeliveredAtItsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		var a arrivals
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour},
			outbox.Subscription{Name: "mail", Handler: a.handle})
		settle(time.Second) // the start-up poll is behind
		due := time.Now().Add(10 * time.Minute)
		id := publishEnv(t, ob, st, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: due})
		now := publishEnv(t, ob, st, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`)})
		settle(10*time.Minute - time.Millisecond)
		if at, ok := a.when(id); ok {
			t.Fatalf("delayed event delivered at %v, %v before its NotBefore", at, due.Sub(at))
		}
		if _, ok := a.when(now); !ok {
			t.Fatal("the event published without delay beside it was not delivered at once")
		}
		settle(100 * time.Millisecond)
		at, ok := a.when(id)
		if !ok {
			t.Fatal("delayed event not delivered within 100 ms of its NotBefore (the poll is an hour away)")
		}
		if at.Before(due) {
			t.Errorf("delivered at %v, before its NotBefore %v", at, due)
		}
		if p := a.path[id]; p != outbox.PathCold {
			t.Errorf("delayed event came on the %s path; want the poller's", p)
		}
	})
}

// A delayed ordered event holds back the later events of its key: one
// published after it without delay arrives after it, at its time; other
// keys go on.
func TestDelayedOrderedEventHoldsBackItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		var a arrivals
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour},
			outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Handler: a.handle})
		settle(time.Second)
		key := func(agg string, notBefore time.Time) outbox.Envelope {
			return outbox.Envelope{Type: "Posted", AggregateType: "Account", AggregateID: agg, JSON: []byte(`{}`), NotBefore: notBefore}
		}
		due := time.Now().Add(time.Minute)
		first := publishEnv(t, ob, st, key("1", due))
		second := publishEnv(t, ob, st, key("1", time.Time{}))
		other := publishEnv(t, ob, st, key("2", time.Time{}))
		settle(30 * time.Second)
		if _, ok := a.when(other); !ok {
			t.Fatal("another key's event waited for the delayed one")
		}
		if _, ok := a.when(second); ok {
			t.Fatal("the event after a delayed one of its key went first")
		}
		settle(31 * time.Second)
		a.mu.Lock()
		defer a.mu.Unlock()
		wantOrder(t, "the three events", a.order, other, first, second)
	})
}

// NotBefore is checked at Publish: more than MaxDelay ahead or more than
// MaxClockSkew behind is a ValidationError on NotBefore, and nothing is
// written; a moment behind is an event for now.
func TestNotBeforeIsCheckedAtPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := outboxtest.NewStore()
		var a arrivals
		ob := startedOutbox(t, st, outbox.Config{}, outbox.Subscription{Name: "mail", Handler: a.handle})
		ctx := context.Background()
		for _, c := range []struct {
			at   time.Time
			want string
		}{
			{time.Now().Add(outbox.MaxDelay + time.Hour), "MaxDelay"},
			{time.Now().Add(-outbox.MaxClockSkew - time.Second), "MaxClockSkew"},
		} {
			tx := st.Begin(ctx)
			_, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: c.at})
			var ve *outbox.ValidationError
			if !errors.As(err, &ve) || ve.Field != "NotBefore" || !strings.Contains(err.Error(), c.want) {
				t.Errorf("NotBefore %v: %v; want a ValidationError on NotBefore naming %s", c.at, err, c.want)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		id := publishEnv(t, ob, st, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: time.Now().Add(-10 * time.Second)})
		settle(time.Millisecond)
		if p, ok := a.path[id]; !ok || p != outbox.PathHot {
			t.Errorf("an event with NotBefore a moment ago: delivered %v on %q; want at once, hot", ok, p)
		}
		if s, err := st.Stats(ctx); err != nil || s.New+s.Done != 1 {
			t.Errorf("%+v (%v); want the one valid event only", s, err)
		}
		// A store that cannot delay refuses a delayed event.
		plain, err := outbox.New(struct {
			driver.Store
			driver.DeliveryStore
		}{st, st}, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		tx := st.Begin(ctx)
		defer tx.Rollback()
		if _, err := plain.PublishTx(ctx, tx, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: time.Now().Add(time.Hour)}); err == nil || !strings.Contains(err.Error(), "driver.Scheduler") {
			t.Errorf("a delayed event on a store without Schedule: %v; want an error naming driver.Scheduler", err)
		}
	})
}

// More delayed events than the poller keeps due times for
// (maxRetryWakes): each is still delivered within 100 ms of its
// NotBefore, not at a regular poll (an hour away here); the poller asks
// the store for the due times it gave up.
func TestManyDelayedEventsEachOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const events = 12_000 // more than the 10,000 due times kept
		st := outboxtest.NewStore()
		var a arrivals
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour},
			outbox.Subscription{Name: "mail", Handler: a.handle})
		settle(time.Second)
		start := time.Now().Add(time.Second)
		due := map[string]time.Time{}
		ctx := context.Background()
		for i := 0; i < events; i += 100 {
			tx := st.Begin(ctx)
			envs := make([]outbox.Envelope, 100)
			for j := range envs {
				envs[j] = outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: start.Add(time.Duration(i+j) * 5 * time.Millisecond)}
			}
			ids, err := ob.PublishAllTx(ctx, tx, envs...)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			for j, id := range ids {
				due[id] = envs[j].NotBefore
			}
		}
		settle(time.Duration(events)*5*time.Millisecond + 2*time.Second)
		a.mu.Lock()
		defer a.mu.Unlock()
		late := 0
		var worst time.Duration
		for id, d := range due {
			at, ok := a.at[id]
			if !ok {
				t.Fatalf("event due at %v not delivered", d.Sub(start))
			}
			if at.Before(d) {
				t.Fatalf("event delivered %v before its NotBefore", d.Sub(at))
			}
			if l := at.Sub(d); l > 100*time.Millisecond {
				late++
				worst = max(worst, l)
			}
		}
		if late > 0 {
			t.Errorf("%d of %d delayed events delivered more than 100 ms late (worst %v)", late, events, worst)
		}
	})
}

// More delayed events due at one time than a claim takes: the polls that
// follow a woken poll which got all it asked for take the rest at once,
// not once they are SkipRecent old (or a poll interval later).
func TestDelayedEventsBeyondOneClaimAllOnTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const events = 450 // more than two claims of PollBatchSize
		st := outboxtest.NewStore()
		var a arrivals
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour, PollBatchSize: 200},
			outbox.Subscription{Name: "mail", Handler: a.handle})
		settle(time.Second)
		due := time.Now().Add(time.Minute)
		envs := make([]outbox.Envelope, events)
		for i := range envs {
			envs[i] = outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: due}
		}
		ctx := context.Background()
		tx := st.Begin(ctx)
		ids, err := ob.PublishAllTx(ctx, tx, envs...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		settle(time.Minute + 100*time.Millisecond)
		missing := 0
		for _, id := range ids {
			if _, ok := a.when(id); !ok {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("%d of %d events due at one time not delivered within 100 ms of it", missing, events)
		}
	})
}

// stallingStore's completion writes wait for release: a database whose
// DONE writes stall under load.
type stallingStore struct {
	*outboxtest.Store
	release chan struct{}
}

func (s *stallingStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return s.Store.MarkDone(ctx, owner, ids, registry)
}

// A completion write that stalls holds up no delivery: the events
// committed meanwhile (5,000 here, a second at 5,000 events/s) reach the
// handler while the DONE write waits, none overflowing the hot queue to
// the poller. With room for 4 batches in front of the completer, the
// workers waited on it and 2,496 of them had not arrived.
func TestStalledCompletionWriteHoldsUpNoDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &stallingStore{Store: outboxtest.NewStore(), release: make(chan struct{})}
		defer close(st.release) // before the Close of startedOutbox's cleanup
		var delivered atomic.Int64
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Hour, PollMaxInterval: time.Hour},
			outbox.Subscription{Name: "s", Handler: func(context.Context, outbox.Event) error {
				delivered.Add(1)
				return nil
			}})
		settle(time.Second)
		ctx := context.Background()
		const events = 5000
		for range events / 100 {
			tx := st.Begin(ctx)
			envs := make([]outbox.Envelope, 100)
			for j := range envs {
				envs[j] = outbox.Envelope{Type: "T", JSON: []byte(`{}`)}
			}
			if _, err := ob.PublishAllTx(ctx, tx, envs...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		if got := delivered.Load(); got != events {
			t.Errorf("%d of %d events delivered while the completion write stalled", got, events)
		}
	})
}
