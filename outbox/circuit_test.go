package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// circuitMetrics records the circuit changes the engine reports.
type circuitMetrics struct {
	outbox.NopMetrics
	mu      sync.Mutex
	changes []circuitChange
}

type circuitChange struct {
	sub   string
	state outbox.CircuitState
	at    time.Time
}

func (m *circuitMetrics) Circuit(sub string, s outbox.CircuitState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.changes = append(m.changes, circuitChange{sub, s, time.Now()})
}

// countingStore counts the store calls that deliveries cost.
type countingStore struct {
	*outboxtest.Store
	mu                  sync.Mutex
	claimed, failWrites int // deliveries claimed, FailDelivery calls
	splits              int // events split
}

func (s *countingStore) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	ds, err := s.Store.ClaimDeliveries(ctx, req, subs, f)
	s.mu.Lock()
	s.claimed += len(ds)
	s.mu.Unlock()
	return ds, err
}

func (s *countingStore) FailDelivery(ctx context.Context, owner string, k driver.DeliveryID, w driver.DeliveryWrite) (bool, error) {
	s.mu.Lock()
	s.failWrites++
	s.mu.Unlock()
	return s.Store.FailDelivery(ctx, owner, k, w)
}

func (s *countingStore) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	s.mu.Lock()
	s.splits += len(splits)
	s.mu.Unlock()
	return s.Store.Split(ctx, owner, splits, registry)
}

// A destination down for 10 minutes of (virtual) time under steady
// publishing: its subscription's circuit opens, one probe at a time tries
// it, no event spends an attempt or goes DEAD, the healthy subscription on
// the same events keeps flowing, and once the destination is back every
// event reaches it within one probe interval (plus a poll).
func TestCircuitOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			typ        outbox.EventType = "OrderPlaced"
			publishFor                  = 12 * time.Minute
			downFrom                    = 1 * time.Minute
			downUntil                   = 11 * time.Minute
			callTime                    = 50 * time.Millisecond // each call to the destination
			maxProbe                    = 30 * time.Second
			poll                        = 5 * time.Second
		)
		ctx := context.Background()
		st := &countingStore{Store: outboxtest.NewStore()}
		m := &circuitMetrics{}
		ob, err := outbox.New(st, outbox.Config{
			Logger:       slog.New(slog.DiscardHandler),
			Metrics:      m,
			MaxAttempts:  3,
			PollInterval: poll,
		})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		var (
			mu         sync.Mutex
			published  = map[string]time.Time{}
			healthy    = map[string]time.Time{} // first delivery
			delivered  = map[string]time.Time{} // to the destination that was down
			inFlight   int                      // calls started while the circuit was open, still running
			maxOpen    int                      // most calls in flight at once that started while the circuit was open
			callsDown  int                      // calls while it was down
			callsOpen  int                      // calls while the circuit was open
			badAttempt []string
		)
		down := func(now time.Time) bool {
			d := now.Sub(t0)
			return d >= downFrom && d < downUntil
		}
		if err := ob.Subscribe(outbox.Subscription{
			Name: "webhook", Types: []outbox.EventType{typ}, CircuitMaxProbe: maxProbe,
			Handler: func(ctx context.Context, ev outbox.Event) error {
				// Calls that start while the circuit is open are its
				// probes; calls admitted before it opened may still be
				// running, and are not counted. The engine's own state:
				// the metric is reported a moment after it changes.
				open := ob.CircuitStates()["webhook"] != outbox.CircuitClosed
				mu.Lock()
				if open {
					callsOpen++
					inFlight++
					maxOpen = max(maxOpen, inFlight)
				}
				mu.Unlock()
				defer func() {
					mu.Lock()
					if open {
						inFlight--
					}
					mu.Unlock()
				}()
				time.Sleep(callTime)
				mu.Lock()
				defer mu.Unlock()
				if down(time.Now()) {
					callsDown++
					return outbox.Unavailable(errors.New("503 Service Unavailable"), 0)
				}
				if ev.Attempt != 1 {
					badAttempt = append(badAttempt, ev.ID)
				}
				if _, ok := delivered[ev.ID]; !ok {
					delivered[ev.ID] = time.Now()
				}
				return nil
			},
		}); err != nil {
			t.Fatal(err)
		}
		ob.Handle("audit", func(ctx context.Context, ev outbox.Event) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := healthy[ev.ID]; !ok {
				healthy[ev.ID] = time.Now()
			}
			return nil
		}, typ)
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}

		// One event a second for 12 minutes.
		var midOutage outbox.CircuitState
		for time.Since(t0) < publishFor {
			if midOutage == "" && time.Since(t0) >= 6*time.Minute {
				midOutage = ob.CircuitStates()["webhook"]
			}
			tx := st.Store.Begin(ctx)
			id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: typ, JSON: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			published[id] = time.Now()
			mu.Unlock()
			time.Sleep(time.Second)
		}
		// Everything reaches both, well before 5 more minutes.
		for range 300 {
			mu.Lock()
			all := len(delivered) == len(published) && len(healthy) == len(published)
			mu.Unlock()
			if all {
				break
			}
			time.Sleep(time.Second)
		}
		synctest.Wait()
		if err := ob.Close(ctx); err != nil {
			t.Fatal(err)
		}

		mu.Lock()
		defer mu.Unlock()
		if len(delivered) != len(published) || len(healthy) != len(published) {
			t.Fatalf("of %d events, %d reached the webhook and %d the audit", len(published), len(delivered), len(healthy))
		}
		stats, err := st.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if stats.Dead != 0 || stats.Pending() != 0 || stats.Split != 0 || stats.Done != int64(len(published)) {
			t.Errorf("stats %+v; want all %d DONE, none DEAD", stats, len(published))
		}
		if dls, _ := st.ListDead(ctx, "", 10); len(dls) != 0 {
			t.Errorf("dead letters %+v", dls)
		}
		for id := range published {
			rec, err := st.Inspect(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range rec.Deliveries {
				if d.Attempts != 0 {
					t.Errorf("event %s: %d attempts counted to %s during the outage; want 0", id, d.Attempts, d.Subscription)
				}
			}
		}
		if len(badAttempt) > 0 {
			t.Errorf("%d events delivered at an attempt other than 1 (first %s)", len(badAttempt), badAttempt[0])
		}

		// The healthy subscription kept flowing: every event promptly.
		var worstHealthy time.Duration
		for id, at := range published {
			worstHealthy = max(worstHealthy, healthy[id].Sub(at))
		}
		if worstHealthy > time.Second {
			t.Errorf("the audit subscription got an event %v after it was published; want under 1s throughout", worstHealthy)
		}

		// Recovery: every event reaches the webhook within one probe
		// interval (plus a poll) of its return, or of its publishing if
		// later.
		back := t0.Add(downUntil)
		var lastAfterBack, worstLate time.Duration
		for id, at := range delivered {
			if p := published[id]; p.Before(back) && p.Sub(t0) >= downFrom {
				lastAfterBack = max(lastAfterBack, at.Sub(back))
			} else if p.After(back) {
				worstLate = max(worstLate, at.Sub(p))
			}
		}
		if lastAfterBack > maxProbe+poll {
			t.Errorf("the last event of the outage reached the webhook %v after it came back; want within %v", lastAfterBack, maxProbe+poll)
		}

		// The circuit: at most one probe in flight while open, reported
		// open once and closed once.
		if maxOpen > 1 {
			t.Errorf("%d calls in flight at once while the circuit was open; want one probe at a time", maxOpen)
		}
		m.mu.Lock()
		changes := m.changes
		m.mu.Unlock()
		var states []outbox.CircuitState
		for _, c := range changes {
			if c.sub != "webhook" {
				t.Errorf("circuit change of %s: %s", c.sub, c.state)
			}
			states = append(states, c.state)
		}
		if midOutage == outbox.CircuitClosed || ob.CircuitStates()["webhook"] != outbox.CircuitClosed {
			t.Errorf("circuit state %q in the middle of the outage, %q at the end; want open (or half-open), then closed", midOutage, ob.CircuitStates()["webhook"])
		}
		if len(states) != 2 || states[0] != outbox.CircuitOpen || states[1] != outbox.CircuitClosed {
			t.Errorf("circuit changes %v; want [open closed]", states)
		} else {
			// Once closed, the webhook is as prompt as the audit.
			var worstClosed time.Duration
			for id, p := range published {
				if p.After(changes[1].at) {
					worstClosed = max(worstClosed, delivered[id].Sub(p))
				}
			}
			if worstClosed > time.Second {
				t.Errorf("an event published after the circuit closed reached the webhook %v later; want under 1s", worstClosed)
			}
			t.Logf("events published after the circuit closed reached the webhook within %v", worstClosed)
			t.Logf("circuit open at %v (%v after the outage began), closed at %v (%v after the destination came back)",
				changes[0].at.Sub(t0), changes[0].at.Sub(t0.Add(downFrom)), changes[1].at.Sub(t0), changes[1].at.Sub(back))
		}
		t.Logf("%d events; %d calls to the webhook while it was down (%d while its circuit was open, at most %d in flight); "+
			"the outage's last event delivered %v after it came back, later events within %v of publishing; the audit subscription within %v",
			len(published), callsDown, callsOpen, maxOpen, lastAfterBack, worstLate, worstHealthy)
		st.mu.Lock()
		t.Logf("store: %d splits, %d deliveries claimed, %d FailDelivery writes", st.splits, st.claimed, st.failWrites)
		st.mu.Unlock()
	})
}
