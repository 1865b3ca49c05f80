// Package meta maps an event's metadata onto broker headers the same way
// for every connector (NATS, RabbitMQ, Kafka, Redis Streams, webhooks).
// The table is in adapters/README.md; a connector that cannot carry
// headers (none today) must say so in its README.
//
// The engine's own names win over a user header of the same name; user
// headers, including the W3C trace context (traceparent, tracestate) that
// adapters/otel stores at Publish, are carried as they are.
package meta

import (
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// The header names every connector sets.
const (
	ID            = "txoutbox-id"             // the event id; consumers de-duplicate on it
	Type          = "txoutbox-type"           // the event type
	AggregateType = "txoutbox-aggregate-type" // left out when empty
	AggregateID   = "txoutbox-aggregate-id"   // left out when empty
	TenantID      = "txoutbox-tenant-id"      // left out when empty
	OccurredAt    = "txoutbox-occurred-at"    // RFC 3339 with nanoseconds, UTC
	OrderingKey   = "txoutbox-ordering-key"   // only when OrderingKey is set and is not the default key (aggregate type:id)
	ContentType   = "content-type"            // application/json, or application/octet-stream unless a user header sets it
)

// Header is one name and value.
type Header struct{ Key, Value string }

// TimeFormat is the layout of OccurredAt.
const TimeFormat = time.RFC3339Nano

// Reserved reports whether key is one of the names the engine sets (user
// headers with these names are dropped, except content-type for a
// payload that is not JSON).
func Reserved(key string) bool {
	switch key {
	case ID, Type, AggregateType, AggregateID, TenantID, OccurredAt, OrderingKey:
		return true
	}
	return false
}

// Headers returns ev's metadata as headers: the engine's names first, in
// the order of the constants above, then the user headers sorted by name.
// The order is stable, so a redelivered event produces the same message.
func Headers(ev *outbox.Event) []Header {
	h := make([]Header, 0, 7+len(ev.Headers))
	add := func(k, v string) {
		if v != "" {
			h = append(h, Header{k, v})
		}
	}
	add(ID, ev.ID)
	add(Type, string(ev.Type))
	add(AggregateType, string(ev.AggregateType))
	add(AggregateID, ev.AggregateID)
	add(TenantID, ev.TenantID)
	if !ev.OccurredAt.IsZero() {
		add(OccurredAt, ev.OccurredAt.UTC().Format(TimeFormat))
	}
	// The ordering key, when it is not the one a consumer rebuilds from
	// the aggregate type and id (ev.Key()'s default).
	if k := ev.OrderingKey; k != "" && k != string(ev.AggregateType)+":"+ev.AggregateID {
		add(OrderingKey, k)
	}
	ct := "application/octet-stream"
	if ev.IsJSON() {
		ct = "application/json"
	} else {
		for k, v := range ev.Headers {
			if v != "" && strings.EqualFold(k, ContentType) {
				ct = v
				break
			}
		}
	}
	add(ContentType, ct)
	keys := make([]string, 0, len(ev.Headers))
	for k := range ev.Headers {
		if !Reserved(k) && !strings.EqualFold(k, ContentType) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		h = append(h, Header{k, ev.Headers[k]})
	}
	return h
}

// Envelope rebuilds the envelope a consumer received from the headers
// (looked up with get) and the payload: the inverse of Headers, for
// consumers written in Go and for tests.
func Envelope(get func(key string) string, keys []string, payload []byte) (outbox.Envelope, error) {
	env := outbox.Envelope{
		ID:            get(ID),
		Type:          outbox.EventType(get(Type)),
		AggregateType: outbox.AggregateType(get(AggregateType)),
		AggregateID:   get(AggregateID),
		TenantID:      get(TenantID),
		OrderingKey:   get(OrderingKey),
	}
	if s := get(OccurredAt); s != "" {
		t, err := time.Parse(TimeFormat, s)
		if err != nil {
			return env, err
		}
		env.OccurredAt = t
	}
	switch ct := get(ContentType); ct {
	case "application/json":
		env.JSON = payload
	case "", "application/octet-stream":
		env.Bytes = payload
	default: // a user's content type for a payload that is not JSON
		env.Bytes = payload
		env.Headers = map[string]string{ContentType: ct}
	}
	for _, k := range keys {
		if Reserved(k) || k == ContentType {
			continue
		}
		if env.Headers == nil {
			env.Headers = map[string]string{}
		}
		// Broker headers that are not the event's (Nats-Msg-Id, …) are the
		// caller's to leave out of keys.
		env.Headers[k] = get(k)
	}
	return env, nil
}
