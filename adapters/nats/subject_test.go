package natsoutbox

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/outbox"
)

func TestTemplateValidation(t *testing.T) {
	for _, bad := range []string{
		"", ".events", "events.", "events..x", "{type}", "{type}.x", "events.*", "events.>", "events.a b",
		"events.{nope}", "events.{type", "events.type}", "events.\t", "ev\x00ents",
	} {
		if _, err := parseTemplate(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, good := range []string{"events", "events.{type}", "app.{tenant}.{aggregate_type}.{aggregate_id}.{type}", "e.t-{tenant}.{type}", "$app.{type}"} {
		if _, err := parseTemplate(good); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
}

func TestSubjectRendering(t *testing.T) {
	ev := &outbox.Event{Envelope: outbox.Envelope{
		Type: "order.created", AggregateType: "shop.order", AggregateID: "42.7", TenantID: "",
	}}
	for tmpl, want := range map[string]string{
		"events.{type}":                        "events.order.created",
		"events.{tenant}.{type}":               "events._.order.created",
		"e.{aggregate_type}.{aggregate_id}":    "e.shop.order.42_7",
		"e.t-{aggregate_id}-x":                 "e.t-42_7-x",
		"constant":                             "constant",
		"e.{type}.{aggregate_type}.{tenant}.z": "e.order.created.shop.order._.z",
	} {
		tp, err := parseTemplate(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.subject(ev); got != want {
			t.Errorf("%s: %q, want %q", tmpl, got, want)
		}
	}
	// Wildcards, whitespace, empty tokens and bad UTF-8 never make an
	// invalid subject.
	ev.Type = "a*b.>.c d..\tx.\xff"
	tp, _ := parseTemplate("events.{type}")
	if got, want := tp.subject(ev), "events.a_b._.c_d._._x._"; got != want {
		t.Errorf("sanitised: %q, want %q", got, want)
	}
	for _, tok := range strings.Split(tp.subject(ev), ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t") {
			t.Errorf("bad token %q", tok)
		}
	}
}

func TestTemplateFilter(t *testing.T) {
	for _, c := range []struct {
		tmpl string
		typ  outbox.EventType
		want string
	}{
		{"events.{type}", "order.created", "events.order.created"},
		{"events.{type}", "", "events.>"},
		{"events.{tenant}.{type}", "a", "events.*.a"},
		{"events.{aggregate_type}.{type}", "a", "events.>"},
		{"events.x", "", "events.x"},
	} {
		tp, err := parseTemplate(c.tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if got := tp.filter(c.typ); got != c.want {
			t.Errorf("%s with %q: %q, want %q", c.tmpl, c.typ, got, c.want)
		}
	}
}

// Event headers cannot pass instructions to the server: Nats-* headers are
// dropped, and Nats-Msg-Id is always the event id.
func TestMessageDropsNatsHeaders(t *testing.T) {
	p, err := New(fakeJS{}, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "01J", Type: "t", JSON: []byte(`{}`), Headers: map[string]string{
		"Nats-Msg-Id": "spoof", "nats-rollup": "sub", "NATS-TTL": "1s", "natsy": "kept", "traceparent": "tp",
	}}}
	m := p.Message(ev)
	if got := m.Header["Nats-Msg-Id"]; len(got) != 1 || got[0] != "01J" {
		t.Errorf("Nats-Msg-Id %q", got)
	}
	for _, k := range []string{"nats-rollup", "NATS-TTL"} {
		if _, ok := m.Header[k]; ok {
			t.Errorf("%s kept", k)
		}
	}
	if m.Header.Get("natsy") != "kept" || m.Header.Get("traceparent") != "tp" || m.Header.Get("txoutbox-id") != "01J" {
		t.Errorf("headers %v", m.Header)
	}
}

// fakeJS satisfies jetstream.JetStream for tests that do not publish.
type fakeJS struct{ jetstream.JetStream }
