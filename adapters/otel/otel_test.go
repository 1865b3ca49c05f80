package oteloutbox_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	oteloutbox "github.com/txoutbox/txoutbox/adapters/otel"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// tracing is an SDK tracer provider whose ended spans are kept in memory.
type tracing struct {
	tp  *sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter

	mu      sync.Mutex
	changed chan struct{} // closed when a span ends
}

func newTracing(t *testing.T) *tracing {
	tr := &tracing{exp: tracetest.NewInMemoryExporter(), changed: make(chan struct{})}
	// The exporter first: a span is exported when the notifier runs.
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.exp), sdktrace.WithSpanProcessor(tr))
	t.Cleanup(func() { tr.tp.Shutdown(context.Background()) })
	return tr
}

// The span processor that signals ended spans.
func (tr *tracing) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (tr *tracing) Shutdown(context.Context) error                  { return nil }
func (tr *tracing) ForceFlush(context.Context) error                { return nil }
func (tr *tracing) OnEnd(sdktrace.ReadOnlySpan) {
	tr.mu.Lock()
	close(tr.changed)
	tr.changed = make(chan struct{})
	tr.mu.Unlock()
}

// wait waits until n spans called name have ended, and returns them.
func (tr *tracing) wait(t *testing.T, name string, n int, within time.Duration) []tracetest.SpanStub {
	t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		tr.mu.Lock()
		changed := tr.changed
		tr.mu.Unlock()
		if got := tr.named(name); len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("no %d spans %q within %v: %d", n, name, within, len(tr.named(name)))
		}
	}
}

// named returns the ended spans called name, in the order they ended.
func (tr *tracing) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// same reports whether a and b name the same span (whether remote or not).
func same(a, b trace.SpanContext) bool {
	return a.IsValid() && a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID()
}

func linked(s tracetest.SpanStub, sc trace.SpanContext) bool {
	return slices.ContainsFunc(s.Links, func(l sdktrace.Link) bool { return same(l.SpanContext, sc) })
}

// unit is an outbox on the in-memory store with the interceptor.
type unit struct {
	st *outboxtest.Store
	ob *outbox.Outbox
}

func newUnit(t *testing.T, ic outbox.Interceptor, subs ...outbox.Subscription) *unit {
	t.Helper()
	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{
		Logger:       slog.New(slog.DiscardHandler),
		Interceptors: []outbox.Interceptor{ic},
		Retry:        outbox.RetryFunc(func(int) time.Duration { return 0 }), // due at once, for Drain
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		if err := ob.Subscribe(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ob.Close(ctx)
	})
	return &unit{st: st, ob: ob}
}

// publish publishes each envelope in one transaction, each under the
// context ctxs[i] (or the first), and drains the outbox.
func (u *unit) publish(t *testing.T, ctxs []context.Context, envs ...outbox.Envelope) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx := u.st.Begin(ctx)
	var ids []string
	for i, env := range envs {
		id, err := u.ob.PublishTx(ctxs[min(i, len(ctxs)-1)], tx, env)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := u.st.Drain(ctx, u.ob); err != nil {
		t.Fatal(err)
	}
	return ids
}

// A request publishes: the publish span is its child and its context is
// in the headers; each attempt of the delivery is a process span, child
// of the publish span and linked to it, the failed one with status Error,
// and the handler runs inside it.
func TestPublishAndAttempts(t *testing.T) {
	tr := newTracing(t)
	var seen []trace.SpanContext
	var headers map[string]string
	h := outboxtest.Failing(func(ctx context.Context, ev outbox.Event) error {
		seen = append(seen, trace.SpanContextFromContext(ctx))
		headers = ev.Headers
		return nil
	})
	h.FailNext(1, errors.New("boom"))
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp)),
		outbox.Subscription{Name: "mail", Handler: func(ctx context.Context, ev outbox.Event) error {
			if err := h.Handle(ctx, ev); err != nil {
				seen = append(seen, trace.SpanContextFromContext(ctx))
				return err
			}
			return nil
		}})

	ctx, req := tr.tp.Tracer("test").Start(context.Background(), "request")
	ids := u.publish(t, []context.Context{ctx}, outbox.Envelope{Type: "order.placed", AggregateType: "order", JSON: []byte(`{"n":1}`), Headers: map[string]string{"x": "y"}})
	req.End()

	pubs := tr.named("publish order.placed")
	if len(pubs) != 1 {
		t.Fatalf("%d publish spans, want 1", len(pubs))
	}
	pub := pubs[0]
	if pub.SpanKind != trace.SpanKindProducer || pub.Parent.SpanID() != req.SpanContext().SpanID() || pub.SpanContext.TraceID() != req.SpanContext().TraceID() {
		t.Errorf("publish span kind %v parent %v, want Producer child of the request", pub.SpanKind, pub.Parent.SpanID())
	}
	for k, want := range map[attribute.Key]string{
		"messaging.system": "txoutbox", "messaging.operation.type": "send", "messaging.operation.name": "publish",
		"messaging.destination.name": "order.placed", "messaging.message.id": ids[0], "txoutbox.aggregate_type": "order",
	} {
		if got := attr(pub, k).AsString(); got != want {
			t.Errorf("publish span %s = %q, want %q", k, got, want)
		}
	}
	if got := (propagation.TraceContext{}).Extract(context.Background(), propagation.MapCarrier(headers)); !same(trace.SpanContextFromContext(got), pub.SpanContext) {
		t.Errorf("headers %v do not carry the publish span's context %v", headers, pub.SpanContext)
	}
	if headers["x"] != "y" {
		t.Errorf("the caller's header is lost: %v", headers)
	}

	procs := tr.named("process mail")
	if len(procs) != 2 {
		t.Fatalf("%d process spans, want 2 (one per attempt)", len(procs))
	}
	for i, p := range procs {
		if p.SpanKind != trace.SpanKindConsumer || !linked(p, pub.SpanContext) || p.Parent.SpanID() != pub.SpanContext.SpanID() || p.SpanContext.TraceID() != req.SpanContext().TraceID() {
			t.Errorf("attempt %d: kind %v, parent %v, links %v: want a Consumer child of and linked to the publish span", i+1, p.SpanKind, p.Parent.SpanID(), p.Links)
		}
		if !seen[i].Equal(p.SpanContext) {
			t.Errorf("attempt %d: the handler ran in span %v, want the process span %v", i+1, seen[i].SpanID(), p.SpanContext.SpanID())
		}
		for k, want := range map[attribute.Key]any{
			"messaging.system": "txoutbox", "messaging.operation.type": "process", "messaging.destination.subscription.name": "mail",
			"messaging.destination.name": "order.placed", "messaging.message.id": ids[0], "txoutbox.attempt": int64(i + 1),
			"txoutbox.path": []string{"hot", "cold"}[i], // the retry comes from the poller
		} {
			if got := attr(p, k).AsInterface(); got != want {
				t.Errorf("attempt %d: %s = %v, want %v", i+1, k, got, want)
			}
		}
	}
	if procs[0].Status.Code != codes.Error || procs[0].Status.Description != "boom" || attr(procs[0], "error.type").AsString() == "" {
		t.Errorf("failed attempt: status %+v, error.type %q; want Error boom", procs[0].Status, attr(procs[0], "error.type").AsString())
	}
	if procs[1].Status.Code != codes.Unset {
		t.Errorf("successful attempt: status %+v, want Unset", procs[1].Status)
	}
}

// A batch is one process span, a new root, with a link to the publish
// span of each of its events (here published by three requests).
func TestBatchLinksEveryEvent(t *testing.T) {
	tr := newTracing(t)
	var got trace.SpanContext
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp)),
		outbox.Subscription{Name: "bulk", BatchSize: 3, BatchLinger: time.Minute, Batch: func(ctx context.Context, evs []outbox.Event) error {
			got = trace.SpanContextFromContext(ctx)
			return nil
		}})
	var ctxs []context.Context
	for range 3 {
		ctx, req := tr.tp.Tracer("test").Start(context.Background(), "request")
		req.End()
		ctxs = append(ctxs, ctx)
	}
	env := outbox.Envelope{Type: "T", JSON: []byte(`{}`)}
	u.publish(t, ctxs, env, env, env)

	procs := tr.named("process bulk")
	pubs := tr.named("publish T")
	if len(procs) != 1 || len(pubs) != 3 {
		t.Fatalf("%d process spans and %d publish spans, want 1 and 3", len(procs), len(pubs))
	}
	p := procs[0]
	if p.Parent.IsValid() || len(p.Links) != 3 || !p.SpanContext.Equal(got) {
		t.Errorf("batch span: parent %v, %d links; handler's span %v; want a root with 3 links, the handler inside", p.Parent, len(p.Links), got)
	}
	for _, pub := range pubs {
		if !linked(p, pub.SpanContext) {
			t.Errorf("batch span has no link to publish span %v", pub.SpanContext)
		}
	}
	if n := attr(p, "messaging.batch.message_count").AsInt64(); n != 3 {
		t.Errorf("messaging.batch.message_count = %d, want 3", n)
	}
	if d := attr(p, "messaging.destination.name").AsString(); d != "T" {
		t.Errorf("messaging.destination.name = %q, want T (every event's type)", d)
	}
}

// WithoutPublishSpan stores the request's own span context; WithLinksOnly
// makes the process span a root linked to it.
func TestWithoutPublishSpanLinksOnly(t *testing.T) {
	tr := newTracing(t)
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp), oteloutbox.WithoutPublishSpan(), oteloutbox.WithLinksOnly()),
		outbox.Subscription{Name: "h", Handler: func(context.Context, outbox.Event) error { return nil }})
	ctx, req := tr.tp.Tracer("test").Start(context.Background(), "request")
	u.publish(t, []context.Context{ctx}, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
	req.End()
	if n := len(tr.named("publish T")); n != 0 {
		t.Errorf("%d publish spans, want none", n)
	}
	procs := tr.named("process h")
	if len(procs) != 1 {
		t.Fatalf("%d process spans, want 1", len(procs))
	}
	if p := procs[0]; p.Parent.IsValid() || !linked(p, req.SpanContext()) || p.SpanContext.TraceID() == req.SpanContext().TraceID() {
		t.Errorf("process span parent %v links %v: want a root of its own trace linked to the request span", p.Parent, p.Links)
	}
}

// An event published with no trace, and without a publish span, has no
// trace headers; its process span is a root with no link.
func TestNoTrace(t *testing.T) {
	tr := newTracing(t)
	var headers map[string]string
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp), oteloutbox.WithoutPublishSpan()),
		outbox.Subscription{Name: "h", Handler: func(_ context.Context, ev outbox.Event) error { headers = ev.Headers; return nil }})
	u.publish(t, []context.Context{context.Background()}, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
	if headers != nil {
		t.Errorf("headers %v, want none", headers)
	}
	procs := tr.named("process h")
	if len(procs) != 1 || procs[0].Parent.IsValid() || len(procs[0].Links) != 0 {
		t.Errorf("process spans %+v, want one root with no link", procs)
	}
}

// A handler that panics: its span ends with status Error, and the engine
// still records the failure (the panic reaches it).
func TestPanic(t *testing.T) {
	tr := newTracing(t)
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp)),
		outbox.Subscription{Name: "h", MaxAttempts: 1, Handler: func(context.Context, outbox.Event) error { panic("oops") }})
	ids := u.publish(t, []context.Context{context.Background()}, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
	procs := tr.named("process h")
	if len(procs) != 1 || procs[0].Status.Code != codes.Error || attr(procs[0], "error.type").AsString() != "panic" {
		t.Errorf("process spans %+v, want one with status Error, error.type panic", procs)
	}
	rec, err := u.ob.Inspect(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Deliveries) != 1 || rec.Deliveries[0].Status != outbox.StatusDead {
		t.Errorf("deliveries %+v, want h DEAD after the panic", rec.Deliveries)
	}
}

// An Unavailable destination is marked on the span.
func TestUnavailable(t *testing.T) {
	tr := newTracing(t)
	calls := 0
	u := newUnit(t, oteloutbox.New(oteloutbox.WithTracerProvider(tr.tp)),
		outbox.Subscription{Name: "h", Handler: func(context.Context, outbox.Event) error {
			if calls++; calls == 1 {
				return outbox.Unavailable(errors.New("broker down"), 0)
			}
			return nil
		}})
	u.publish(t, []context.Context{context.Background()}, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
	procs := tr.named("process h")
	if len(procs) == 0 || !attr(procs[0], oteloutbox.UnavailableKey).AsBool() || procs[0].Status.Code != codes.Error {
		t.Fatalf("process spans %+v, want the first marked unavailable", procs)
	}
}
