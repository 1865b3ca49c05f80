package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
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

// faultyStore breaks, on demand, what each health check watches.
type faultyStore struct {
	*outboxtest.Store
	claimFails, doneFails, extendFails, syncFails atomic.Bool
}

var errInjected = errors.New("injected fault")

func (s *faultyStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if s.claimFails.Load() {
		return nil, errInjected
	}
	return s.Store.Claim(ctx, req)
}

func (s *faultyStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	if s.doneFails.Load() {
		return 0, errInjected
	}
	return s.Store.MarkDone(ctx, owner, ids, registry)
}

func (s *faultyStore) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	if s.extendFails.Load() {
		return 0, errInjected
	}
	return s.Store.ExtendLeases(ctx, owner, ids, lease)
}

func (s *faultyStore) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	if s.syncFails.Load() {
		return driver.Registration{}, errInjected
	}
	return s.Store.SyncSubscriptions(ctx, subs)
}

func check(h outbox.HealthStatus, name string) outbox.HealthCheck {
	for _, c := range h.Checks {
		if c.Name == name {
			return c
		}
	}
	return outbox.HealthCheck{Name: name + " (missing)"}
}

func publishOne(t *testing.T, st *faultyStore, ob *outbox.Outbox, typ ...outbox.EventType) string {
	t.Helper()
	tx := st.Begin(context.Background())
	et := outbox.EventType("T")
	if len(typ) > 0 {
		et = typ[0]
	}
	id, err := ob.PublishTx(context.Background(), tx, outbox.Envelope{Type: et, JSON: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// Each check fails when what it watches stops, and recovers with it:
// the poller (claims failing for two back-off intervals), completion
// writes, lease renewals (liveness); database writes (readiness);
// stuck handler calls are counted.
func TestHealthFollowsWhatItWatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &faultyStore{Store: outboxtest.NewStore()}
		ob, err := outbox.New(st, outbox.Config{
			PollInterval: time.Second, PollMaxInterval: 2 * time.Second, Lease: 3 * time.Second,
			ListenerTimeout: time.Second, StatsInterval: -1, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		release, hold := make(chan struct{}), make(chan struct{})
		ob.Handle("h", func(ctx context.Context, ev outbox.Event) error { return nil }, "T")
		if err := ob.Subscribe(outbox.Subscription{Name: "slow", Types: []outbox.EventType{"Slow"}, Timeout: time.Minute,
			Handler: func(ctx context.Context, ev outbox.Event) error { <-hold; return nil }}); err != nil {
			t.Fatal(err)
		}
		ob.Handle("stuck", func(ctx context.Context, ev outbox.Event) error { <-release; return nil }, "Stuck") // ignores its context
		ctx := context.Background()
		if h := ob.Health(ctx); h.Live || h.Ready {
			t.Fatalf("before Start: %+v; want neither live nor ready", h)
		}
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer ob.Close(ctx)
		var once sync.Once
		unstick := func() { once.Do(func() { close(release) }) }
		defer unstick() // before Close, even when the test fails
		if h := ob.Health(ctx); !h.Live || !h.Ready {
			t.Fatalf("after Start: %+v; want live and ready", h)
		}

		// The poller: claims failing for longer than the limit.
		st.claimFails.Store(true)
		time.Sleep(2*2*time.Second + 16*time.Second)
		if h := ob.Health(ctx); h.Live || check(h, "poller").OK || !h.Ready {
			t.Fatalf("claims failing: %+v; want not live (poller), still ready", h)
		}
		st.claimFails.Store(false)
		time.Sleep(3 * time.Second)
		if h := ob.Health(ctx); !h.Live {
			t.Fatalf("claims back: %+v; want live", h)
		}

		// Completion writes failing.
		st.doneFails.Store(true)
		for range 3 {
			publishOne(t, st, ob)
			time.Sleep(2 * time.Second) // the write and its retries
		}
		if h := ob.Health(ctx); h.Live || check(h, "completion").OK {
			t.Fatalf("completion failing: %+v; want not live", h)
		}
		st.doneFails.Store(false)
		publishOne(t, st, ob)
		time.Sleep(time.Second)
		if h := ob.Health(ctx); !check(h, "completion").OK {
			t.Fatalf("completion back: %+v", h)
		}

		// Lease renewals failing while an event is held.
		st.extendFails.Store(true)
		publishOne(t, st, ob, "Slow")
		time.Sleep(2500 * time.Millisecond) // two renewal rounds, Lease/3 apart
		if h := ob.Health(ctx); h.Live || check(h, "leases").OK {
			t.Fatalf("renewals failing: %+v; want not live", h)
		}
		st.extendFails.Store(false)
		time.Sleep(time.Second)
		if h := ob.Health(ctx); !h.Live || !check(h, "leases").OK {
			t.Fatalf("renewals back: %+v; want live", h)
		}
		close(hold)

		// A handler call that ignores its context, past its timeout, is
		// counted until it returns.
		publishOne(t, st, ob, "Stuck")
		time.Sleep(ob.Config().ListenerTimeout + time.Second)
		if d := check(ob.Health(ctx), "handlers").Detail; !strings.HasPrefix(d, "1 ") {
			t.Fatalf("handlers: %q; want one call past its timeout", d)
		}
		unstick()
		time.Sleep(time.Millisecond)
		if d := check(ob.Health(ctx), "handlers").Detail; !strings.HasPrefix(d, "0 ") {
			t.Fatalf("handlers after it returned: %q", d)
		}

		// The database refusing writes: not ready, still live.
		st.syncFails.Store(true)
		rec := httptest.NewRecorder()
		ob.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `"ready":false`) {
			t.Fatalf("ReadyHandler with the database refusing writes: %d %s", rec.Code, rec.Body)
		}
		rec = httptest.NewRecorder()
		ob.LiveHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/livez", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("LiveHandler: %d %s; want 200", rec.Code, rec.Body)
		}
		st.syncFails.Store(false)
		if h := ob.Health(ctx); !h.Ready || !h.Live {
			t.Fatalf("all back: %+v", h)
		}
	})
}
