package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/internal/testbroker"
)

// TestMain fails the run if an outbox or connector goroutine outlives the
// program.
func TestMain(m *testing.M) { leakcheck.Main(m) }

// span is what the test reads of a span the stdout exporter printed.
type span struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	Links       []struct {
		SpanContext struct{ TraceID, SpanID string }
	}
}

// The program's -once round trip against the real NATS: the message's
// traceparent carries the request's trace id and the publish span's id,
// and the printed spans are one trace: client request → server span →
// publish span → process span (linked to the publish span), and the
// subscriber's span continues it.
func TestOnceRoundTrip(t *testing.T) {
	url := testbroker.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, spansOut bytes.Buffer
	rt, err := run(ctx, options{natsURL: url, addr: "127.0.0.1:0", once: true, out: &out, spans: &spansOut})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	got, err := traceOf(rt.traceparent)
	if err != nil || got != rt.traceID {
		t.Fatalf("the message's traceparent %q, want one in the request's trace %s", rt.traceparent, rt.traceID)
	}

	spans := map[string]span{}
	dec := json.NewDecoder(&spansOut)
	for {
		var s span
		if err := dec.Decode(&s); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode the printed spans: %v", err)
		}
		spans[s.Name] = s
	}
	var names []string
	for n := range spans {
		names = append(names, n)
	}
	t.Logf("spans: %s", strings.Join(names, ", "))
	need := func(name string) span {
		t.Helper()
		s, ok := spans[name]
		if !ok {
			t.Fatalf("no span %q printed", name)
		}
		if s.SpanContext.TraceID != rt.traceID {
			t.Errorf("span %q in trace %s, want the request's %s", name, s.SpanContext.TraceID, rt.traceID)
		}
		return s
	}
	client, server := need("POST /orders/{id}"), need("POST /orders/1")
	pub, proc, handle := need("publish order.placed"), need("process to-nats"), need("handle order.placed")
	if server.Parent.SpanID != client.SpanContext.SpanID {
		t.Errorf("server span's parent %s, want the client span %s", server.Parent.SpanID, client.SpanContext.SpanID)
	}
	if pub.Parent.SpanID != server.SpanContext.SpanID {
		t.Errorf("publish span's parent %s, want the server span %s", pub.Parent.SpanID, server.SpanContext.SpanID)
	}
	if proc.Parent.SpanID != pub.SpanContext.SpanID || len(proc.Links) != 1 || proc.Links[0].SpanContext.SpanID != pub.SpanContext.SpanID {
		t.Errorf("process span's parent %s and links %+v, want the publish span %s as both", proc.Parent.SpanID, proc.Links, pub.SpanContext.SpanID)
	}
	if want := "00-" + rt.traceID + "-" + pub.SpanContext.SpanID + "-01"; rt.traceparent != want {
		t.Errorf("traceparent %q, want %q (the publish span)", rt.traceparent, want)
	}
	if handle.Parent.SpanID != pub.SpanContext.SpanID {
		t.Errorf("subscriber span's parent %s, want the publish span %s", handle.Parent.SpanID, pub.SpanContext.SpanID)
	}
	if !strings.Contains(out.String(), "one trace from the HTTP request to the NATS subscriber: "+rt.traceID) {
		t.Errorf("no verdict in the output")
	}
}
