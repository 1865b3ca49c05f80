package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// keyLog records what an ordered subscription received, key by key, and
// fails the test if two events of one key are ever in its handler at once.
type keyLog struct {
	t        testing.TB
	mu       sync.Mutex
	inflight map[string]bool
	got      map[string][]string // key → "id" per successful delivery
	fail     func(ev outbox.Event) error
	done     chan struct{}
	want     int
	n        int
}

func newKeyLog(t testing.TB, want int) *keyLog {
	return &keyLog{t: t, inflight: map[string]bool{}, got: map[string][]string{}, done: make(chan struct{}), want: want}
}

func (l *keyLog) handle(ctx context.Context, ev outbox.Event) error {
	k := ev.Key()
	l.mu.Lock()
	if l.inflight[k] {
		l.t.Errorf("two events of key %s in the handler at once (the second is %s)", k, ev.ID)
	}
	l.inflight[k] = true
	l.mu.Unlock()
	var err error
	if l.fail != nil {
		err = l.fail(ev)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[k] = false
	if err != nil {
		return err
	}
	l.got[k] = append(l.got[k], ev.ID)
	l.n++
	if l.n == l.want {
		close(l.done)
	}
	return nil
}

func (l *keyLog) wait(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-l.done:
	case <-time.After(d):
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Fatalf("delivered %d of %d events in %v", l.n, l.want, d)
	}
}

// publishInTx publishes env in a transaction of its own.
func publishInTx(t testing.TB, ob *outbox.Outbox, st *sqlstore.Store, env outbox.Envelope) string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.PublishTx(ctx, tx, env)
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// A failed event holds back the later events of its key, for the ordered
// subscription, and nothing else: key B is delivered while key A's first
// event waits for its retry, and A's events arrive in publish order after
// it. Two events of one key are never in the handler at once.
func TestOrderedSubscriptionHoldsBackOnlyTheFailedKey(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			log := newKeyLog(t, 6)
			var a1 string
			var failedOnce sync.Once
			log.fail = func(ev outbox.Event) error {
				if ev.ID != a1 {
					return nil
				}
				var err error
				failedOnce.Do(func() { err = errors.New("first attempt fails") })
				if err == nil {
					// The retry, 300 ms later: key B went on meanwhile.
					log.mu.Lock()
					if len(log.got["Order:B"]) == 0 {
						t.Errorf("A1 retried before any event of key B was delivered")
					}
					log.mu.Unlock()
				}
				return err
			}
			if err := ob.Subscribe(outbox.Subscription{Name: "projection", Order: outbox.Ordered, Handler: log.handle,
				Retry: outbox.RetryFunc(func(int) time.Duration { return 300 * time.Millisecond })}); err != nil {
				t.Fatal(err)
			}
			if err := ob.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer ob.Close(context.Background())
			a1 = outbox.NewID()
			var wantA, wantB []string
			wantA = append(wantA, publishInTx(t, ob, st, outbox.Envelope{ID: a1, Type: "Placed", AggregateType: "Order", AggregateID: "A", JSON: []byte(`{}`)}))
			for i := range 2 {
				wantA = append(wantA, publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "A", JSON: fmt.Appendf(nil, `{"i":%d}`, i)}))
			}
			for i := range 3 {
				wantB = append(wantB, publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: "B", JSON: fmt.Appendf(nil, `{"i":%d}`, i)}))
			}
			log.wait(t, 20*time.Second)
			log.mu.Lock()
			defer log.mu.Unlock()
			if !slices.Equal(log.got["Order:A"], wantA) {
				t.Errorf("key A delivered as %v, published as %v", log.got["Order:A"], wantA)
			}
			if !slices.Equal(log.got["Order:B"], wantB) {
				t.Errorf("key B delivered as %v, published as %v", log.got["Order:B"], wantB)
			}
		})
	}
}
