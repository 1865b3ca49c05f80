package oteloutbox_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	oteloutbox "github.com/txoutbox/txoutbox/adapters/otel"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// upstream is the trace context of the caller of the HTTP request, as a
// browser or another service sends it.
const (
	upstreamTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	upstreamParent = "00f067aa0ba902b7"
)

// serverSpans is what otelhttp does for a server: continue the caller's
// trace from the request headers in a span of kind Server.
func serverSpans(tp trace.TracerProvider, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tp.Tracer("http").Start(ctx, r.Method+" /orders/{id}", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// app is a service on SQLite: an HTTP handler that publishes
// order.placed in the request's transaction (txmw), an outbox traced by
// oteloutbox, and a connector subscribed by connect.
type app struct {
	tr  *tracing
	db  *sqlx.DB
	ob  *outbox.Outbox
	srv *httptest.Server
}

func newApp(t *testing.T, connect func(ob *outbox.Outbox)) *app {
	t.Helper()
	a := &app{tr: newTracing(t), db: testdb.SQLite(t)}
	store := testdb.Store(t, a.db)
	ob, err := outbox.New(store, outbox.Config{
		Logger:       slog.New(slog.DiscardHandler),
		Interceptors: []outbox.Interceptor{oteloutbox.New(oteloutbox.WithTracerProvider(a.tr.tp))},
		PollInterval: 100 * time.Millisecond, PollMaxInterval: 200 * time.Millisecond, SkipRecent: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	a.ob = ob
	connect(ob)
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the broker connections: cleanups run last-in first-out
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ob.Close(ctx); err != nil {
			t.Errorf("close outbox: %v", err)
		}
	})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, err := outbox.Publish(r.Context(), outbox.Envelope{
			Type: "order.placed", AggregateType: "order", AggregateID: r.PathValue("id"), JSON: []byte(`{"total":42}`),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	a.srv = httptest.NewServer(serverSpans(a.tr.tp, txmw.Transactional(a.db, middleware.WithOutbox(ob))(mux)))
	t.Cleanup(a.srv.Close)
	return a
}

// order sends POST /orders/42 with the upstream trace context.
func (a *app) order(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, a.srv.URL+"/orders/42", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", "00-"+upstreamTrace+"-"+upstreamParent+"-01")
	resp, err := a.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders/42: %s", resp.Status)
	}
}

// checkTrace checks the spans of one order delivered by subscription sub
// and the trace context a consumer got in the broker message's headers
// (get reads a header): the request span continues the upstream trace,
// the publish span is its child, the process span its grandchild and
// linked to the publish span, the message carries the publish span's
// context, and a consumer continuing it is in the same trace.
func (a *app) checkTrace(t *testing.T, sub string, get func(string) string) {
	t.Helper()
	reqs := a.tr.wait(t, "POST /orders/{id}", 1, 10*time.Second)
	pubs := a.tr.wait(t, "publish order.placed", 1, 10*time.Second)
	procs := a.tr.wait(t, "process "+sub, 1, 10*time.Second)
	req, pub, proc := reqs[0], pubs[0], procs[0]
	if got := req.SpanContext.TraceID().String(); got != upstreamTrace || req.Parent.SpanID().String() != upstreamParent {
		t.Fatalf("request span in trace %s under %s, want the upstream %s under %s", got, req.Parent.SpanID(), upstreamTrace, upstreamParent)
	}
	if pub.Parent.SpanID() != req.SpanContext.SpanID() || pub.SpanContext.TraceID() != req.SpanContext.TraceID() {
		t.Errorf("publish span parent %s, want the request span %s", pub.Parent.SpanID(), req.SpanContext.SpanID())
	}
	if !linked(proc, pub.SpanContext) || proc.Parent.SpanID() != pub.SpanContext.SpanID() || proc.SpanContext.TraceID() != req.SpanContext.TraceID() {
		t.Errorf("process span parent %s links %v, want a child of and linked to the publish span %s", proc.Parent.SpanID(), proc.Links, pub.SpanContext.SpanID())
	}
	if proc.SpanKind != trace.SpanKindConsumer || proc.Status.Code != 0 || attr(proc, "messaging.destination.subscription.name").AsString() != sub {
		t.Errorf("process span kind %v status %v attributes %v", proc.SpanKind, proc.Status, proc.Attributes)
	}

	traceparent := get("traceparent")
	if want := "00-" + upstreamTrace + "-" + pub.SpanContext.SpanID().String() + "-01"; traceparent != want {
		t.Errorf("broker message traceparent %q, want %q (the request's trace, the publish span)", traceparent, want)
	}
	// The consumer's side: continue the trace from the message.
	cctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent, "tracestate": get("tracestate")})
	consumerTP := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	defer consumerTP.Shutdown(context.Background())
	_, span := consumerTP.Tracer("consumer").Start(cctx, "handle order.placed", trace.WithSpanKind(trace.SpanKindConsumer))
	span.End()
	if got := span.SpanContext().TraceID().String(); got != upstreamTrace {
		t.Errorf("consumer span in trace %s, want the request's %s", got, upstreamTrace)
	}
	if t.Failed() {
		var names []string
		for _, s := range a.tr.exp.GetSpans() {
			names = append(names, s.Name+" "+s.SpanContext.SpanID().String()+"<"+s.Parent.SpanID().String())
		}
		t.Logf("spans: %s", strings.Join(names, ", "))
	}
}
