package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/txoutbox/txoutbox/outbox"
)

// logDelivered is a listener for every event: one structured log line per
// delivery. It logs ids and types, never the payload, which may hold
// personal data.
func logDelivered(log *slog.Logger) outbox.Handler {
	return func(ctx context.Context, ev outbox.Event) error {
		log.LogAttrs(ctx, slog.LevelInfo, "event delivered",
			slog.String("event_id", ev.ID),
			slog.String("event_type", ev.Type.String()),
			slog.String("aggregate", ev.AggregateType.String()+"/"+ev.AggregateID),
			slog.String("path", string(ev.Path)),
			slog.Int("attempt", ev.Attempt))
		return nil
	}
}

// readModel is a projection the listeners keep up to date: how many events
// of each type were delivered, and the open orders and their value. It lives
// in memory and starts empty at every start; a real one would be a table,
// updated in the listener's own transaction together with the id of the
// event, so that a redelivery is recognised across restarts.
type readModel struct {
	mu             sync.Mutex
	seen           map[string]struct{} // delivery is at least once: count each event id once
	delivered      map[outbox.EventType]int64
	openOrders     int64
	openValueCents int64
}

func newReadModel() *readModel {
	return &readModel{seen: map[string]struct{}{}, delivered: map[outbox.EventType]int64{}}
}

// register subscribes the read model to the order events, in order of
// each order: an order's OrderCancelled never reaches it before its
// OrderPlaced, even if OrderPlaced failed its first attempt (the key is the
// envelope's aggregate, "order:<id>").
func (m *readModel) register(ob *outbox.Outbox) error {
	return ob.Subscribe(outbox.Subscription{
		Name:  "read-model",
		Types: []outbox.EventType{OrderPlaced, OrderCancelled},
		Order: outbox.Ordered,
		Handler: func(ctx context.Context, ev outbox.Event) error {
			switch ev.Type {
			case OrderPlaced:
				var p orderPlaced
				if err := json.Unmarshal(ev.JSON, &p); err != nil {
					return outbox.Permanent(fmt.Errorf("restapi: OrderPlaced %s: payload is not an order", ev.ID))
				}
				m.apply(ev, 1, p.TotalCents)
			case OrderCancelled:
				var p orderCancelled
				if err := json.Unmarshal(ev.JSON, &p); err != nil {
					return outbox.Permanent(fmt.Errorf("restapi: OrderCancelled %s: payload is not a cancellation", ev.ID))
				}
				m.apply(ev, -1, -p.TotalCents)
			}
			return nil
		},
	})
}

func (m *readModel) apply(ev outbox.Event, orders, cents int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.seen[ev.ID]; dup {
		return
	}
	m.seen[ev.ID] = struct{}{}
	m.delivered[ev.Type]++
	m.openOrders += orders
	m.openValueCents += cents
}

// eventStats is the body of GET /events/stats.
type eventStats struct {
	// Delivered counts the events the listeners received since start, by type.
	Delivered map[outbox.EventType]int64 `json:"delivered"`
	// ReadModel is what the listeners built from them.
	ReadModel struct {
		OpenOrders     int64 `json:"open_orders"`
		OpenValueCents int64 `json:"open_value_cents"`
	} `json:"read_model"`
	// Outbox counts the rows of the outbox table by status.
	Outbox struct {
		New   int64 `json:"new"`
		Retry int64 `json:"retry"`
		Done  int64 `json:"done"`
		Dead  int64 `json:"dead"`
		// Split counts the events some subscriptions owe still, or gave
		// up on, while others have them: a connector that waits for its
		// broker, or a webhook's dead letter (outboxctl stats and dead list
		// say which).
		Split                int64   `json:"split"`
		OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	} `json:"outbox"`
}

func (a *app) eventStats(w http.ResponseWriter, r *http.Request) {
	var out eventStats
	a.model.mu.Lock()
	out.Delivered = make(map[outbox.EventType]int64, len(a.model.delivered))
	for k, v := range a.model.delivered {
		out.Delivered[k] = v
	}
	out.ReadModel.OpenOrders = a.model.openOrders
	out.ReadModel.OpenValueCents = a.model.openValueCents
	a.model.mu.Unlock()

	s, err := a.store.Stats(r.Context())
	if err != nil {
		a.internal(w, r, "read outbox stats", err)
		return
	}
	out.Outbox.New, out.Outbox.Retry, out.Outbox.Done, out.Outbox.Dead, out.Outbox.Split = s.New, s.Retry, s.Done, s.Dead, s.Split
	out.Outbox.OldestPendingSeconds = s.OldestPending.Seconds()
	writeJSON(w, http.StatusOK, out)
}
