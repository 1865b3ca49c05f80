package meta

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

func TestHeadersRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 23, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	ev := &outbox.Event{Envelope: outbox.Envelope{
		ID: "01J", Type: "order.created", AggregateType: "order", AggregateID: "42", TenantID: "t1",
		OccurredAt: at, JSON: json.RawMessage(`{"a":1}`),
		Headers: map[string]string{"traceparent": "00-abc-def-01", "b": "2", ID: "spoof"},
	}}
	h := Headers(ev)
	want := []Header{
		{ID, "01J"}, {Type, "order.created"}, {AggregateType, "order"}, {AggregateID, "42"},
		{TenantID, "t1"}, {OccurredAt, "2026-11-23T09:00:00.123456789Z"}, {ContentType, "application/json"},
		{"b", "2"}, {"traceparent", "00-abc-def-01"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("Headers:\n got %v\nwant %v", h, want)
	}
	m := map[string]string{}
	var keys []string
	for _, x := range h {
		m[x.Key] = x.Value
		keys = append(keys, x.Key)
	}
	env, err := Envelope(func(k string) string { return m[k] }, keys, ev.JSON)
	if err != nil {
		t.Fatal(err)
	}
	if env.ID != "01J" || !env.OccurredAt.Equal(at) || string(env.JSON) != `{"a":1}` ||
		!reflect.DeepEqual(env.Headers, map[string]string{"b": "2", "traceparent": "00-abc-def-01"}) {
		t.Fatalf("Envelope: %+v", env)
	}
}

func TestContentTypeOfBytes(t *testing.T) {
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "t", Bytes: []byte{1}}}
	if got := Headers(ev); got[len(got)-1] != (Header{ContentType, "application/octet-stream"}) {
		t.Fatalf("%v", got)
	}
	ev.Headers = map[string]string{"Content-Type": "application/protobuf"}
	got := Headers(ev)
	if got[len(got)-1] != (Header{ContentType, "application/protobuf"}) {
		t.Fatalf("%v", got)
	}
	env, err := Envelope(func(k string) string {
		for _, h := range got {
			if h.Key == k {
				return h.Value
			}
		}
		return ""
	}, []string{ID, Type, ContentType}, []byte{1})
	if err != nil || env.Headers[ContentType] != "application/protobuf" || len(env.Bytes) != 1 {
		t.Fatalf("Envelope = %+v, %v; want the user's content type kept", env, err)
	}
}

// An ordering key that is not the default (aggregate type:id) travels as
// a header and comes back; the default one, which an ordered event carries
// as stored, is left out: the consumer rebuilds it with Key.
func TestOrderingKeyHeader(t *testing.T) {
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "t", AggregateType: "order", AggregateID: "42",
		OrderingKey: "customer:7", Bytes: []byte{1}}}
	h := Headers(ev)
	want := []Header{{ID, "1"}, {Type, "t"}, {AggregateType, "order"}, {AggregateID, "42"},
		{OrderingKey, "customer:7"}, {ContentType, "application/octet-stream"}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("Headers:\n got %v\nwant %v", h, want)
	}
	get := func(k string) string {
		for _, x := range h {
			if x.Key == k {
				return x.Value
			}
		}
		return ""
	}
	if env, err := Envelope(get, []string{OrderingKey}, nil); err != nil || env.OrderingKey != "customer:7" || env.Key() != "customer:7" || env.Headers != nil {
		t.Fatalf("Envelope: %+v %v", env, err)
	}
	ev.OrderingKey = "order:42"
	h = Headers(ev)
	if env, _ := Envelope(get, nil, nil); get(OrderingKey) != "" || env.Key() != "order:42" {
		t.Fatalf("the default key is sent: %v", h)
	}
	ev.Headers = map[string]string{OrderingKey: "spoof"}
	if h = Headers(ev); get(OrderingKey) != "" {
		t.Fatalf("a user header passes for the ordering key: %v", h)
	}
}
