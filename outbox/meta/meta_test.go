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
