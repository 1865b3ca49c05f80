package sqlstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// timedLog records when each event reached the handler.
type timedLog struct {
	mu    sync.Mutex
	at    map[string]time.Time
	order []string
}

func (l *timedLog) handle(ctx context.Context, ev outbox.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = map[string]time.Time{}
	}
	if _, ok := l.at[ev.ID]; !ok {
		l.at[ev.ID] = time.Now()
		l.order = append(l.order, ev.ID)
	}
	return nil
}

func (l *timedLog) when(id string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.at[id]
	return t, ok
}

// A delayed event is delivered at its NotBefore and not before, on the
// database's clock: while the instance that published it runs, it wakes
// its poller then (its poll is an hour away, and no other instance
// runs); if it is gone, another instance's poll takes it. An ordered one holds back the later event of
// its key, published without delay after it.
func TestDelayedEventIsDeliveredAtItsTime(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			var l timedLog
			subs := []outbox.Subscription{
				{Name: "plain", Types: []outbox.EventType{"Remind"}, Handler: l.handle},
				{Name: "ordered", Types: []outbox.EventType{"Posted"}, Order: outbox.Ordered, Handler: l.handle},
			}
			publisher := startOrdered(t, st, outbox.Config{InstanceID: "publisher", PollInterval: time.Hour, PollMaxInterval: time.Hour}, subs...)
			leaving := startOrdered(t, st, outbox.Config{InstanceID: "leaving", PollInterval: time.Hour, PollMaxInterval: time.Hour, DisableHotPath: true})
			due := time.Now().Add(1500 * time.Millisecond)
			woken := publishInTx(t, publisher, st, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: due})
			first := publishInTx(t, publisher, st, outbox.Envelope{Type: "Posted", AggregateType: "Account", AggregateID: "1", JSON: []byte(`{}`), NotBefore: due})
			second := publishInTx(t, publisher, st, outbox.Envelope{Type: "Posted", AggregateType: "Account", AggregateID: "1", JSON: []byte(`{}`)})
			// Published by an instance that leaves at once, due when no
			// wake-up is set: another instance's poll delivers it.
			orphanDue := due.Add(time.Second)
			orphan := publishInTx(t, leaving, st, outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: orphanDue})
			if err := leaving.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			// An event that waits on purpose does not look stuck: its age
			// counts from its due time.
			types, err := st.StatsByType(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, ts := range types {
				if ts.Type == "Remind" && ts.Oldest > 0 {
					t.Errorf("oldest pending Remind event %v old while every one waits for its NotBefore; want 0", ts.Oldest)
				}
			}
			waitUntil(t, 30*time.Second, "the delayed events delivered by their publisher, woken at their time", func() bool {
				for _, id := range []string{woken, first, second} {
					if _, ok := l.when(id); !ok {
						return false
					}
				}
				return true
			})
			startOrdered(t, st, outbox.Config{InstanceID: "poller", PollInterval: 100 * time.Millisecond, PollMaxInterval: 100 * time.Millisecond, SkipRecent: 10 * time.Millisecond}, subs...)
			waitUntil(t, 30*time.Second, "the orphan delivered by another instance", func() bool {
				for _, id := range []string{orphan} {
					if _, ok := l.when(id); !ok {
						return false
					}
				}
				return true
			})
			for id, due := range map[string]time.Time{woken: due, first: due, orphan: orphanDue} {
				at, _ := l.when(id)
				if at.Before(due) {
					t.Errorf("event %s delivered %v before its NotBefore", id, due.Sub(at))
				}
				if late := at.Sub(due); late > 5*time.Second {
					t.Errorf("event %s delivered %v after its NotBefore; want it near its time", id, late)
				}
			}
			if at, _ := l.when(second); at.Before(due) {
				t.Errorf("the event after a delayed one of its key went %v before it was due", due.Sub(at))
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			var key []string
			for _, id := range l.order {
				if id == first || id == second {
					key = append(key, id)
				}
			}
			if len(key) != 2 || key[0] != first {
				t.Errorf("key Account:1 delivered as %v; want %s (delayed) then %s", key, first, second)
			}
		})
	}
}
