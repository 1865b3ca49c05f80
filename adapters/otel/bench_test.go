package oteloutbox_test

import (
	"context"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	oteloutbox "github.com/txoutbox/txoutbox/adapters/otel"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// The cost the interceptor adds to a Publish (into the in-memory store,
// so that the store does not hide it) and to a handler call, with an SDK
// that samples every span and exports to nothing.
func BenchmarkInterceptor(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter())))
	defer tp.Shutdown(context.Background())
	ic := oteloutbox.New(oteloutbox.WithTracerProvider(tp))
	rctx, span := tp.Tracer("bench").Start(context.Background(), "request")
	defer span.End()
	for _, bc := range []struct {
		name string
		ics  []outbox.Interceptor
	}{{"none", nil}, {"otel", []outbox.Interceptor{ic}}} {
		b.Run("publish/"+bc.name, func(b *testing.B) {
			st := outboxtest.NewStore()
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler), Interceptors: bc.ics, DisableHotPath: true})
			if err != nil {
				b.Fatal(err)
			}
			env := outbox.Envelope{Type: "order.placed", JSON: []byte(`{"id":1}`), Headers: map[string]string{"x": "y"}}
			b.ReportAllocs()
			for b.Loop() {
				tx := st.Begin(rctx)
				if _, err := ob.PublishTx(rctx, tx, env); err != nil {
					b.Fatal(err)
				}
				tx.Rollback()
			}
		})
	}
	b.Run("deliver/otel", func(b *testing.B) {
		env := outbox.Envelope{Type: "order.placed", ID: outbox.NewID(), JSON: []byte(`{"id":1}`), Headers: map[string]string{}}
		ic.Publish(rctx, &env)
		evs := []outbox.Event{{Envelope: env, Attempt: 1, Path: outbox.PathHot, Subscription: "s"}}
		next := func(context.Context) error { return nil }
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if err := ic.Deliver(ctx, "s", evs, next); err != nil {
				b.Fatal(err)
			}
		}
	})
}
