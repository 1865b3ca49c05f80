package oteloutbox_test

import (
	"context"
	"fmt"
	"slices"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	oteloutbox "github.com/txoutbox/txoutbox/adapters/otel"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// Wiring: the interceptor in the outbox's Config. A request's span is the
// parent of the publish span; the delivery is a process span, child of
// and linked to it; the event's headers carry the trace context, which
// a connector copies onto the broker's message.
func Example() {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)

	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{
		Interceptors: []outbox.Interceptor{oteloutbox.New(oteloutbox.WithTracerProvider(tp))},
	})
	if err != nil {
		panic(err)
	}
	ob.Handle("mailer", func(ctx context.Context, ev outbox.Event) error {
		_, hasTrace := ev.Headers["traceparent"]
		fmt.Println("handler: traceparent in the headers:", hasTrace)
		return nil
	}, "order.placed")
	if err := ob.Start(ctx); err != nil {
		panic(err)
	}
	defer ob.Close(ctx)

	// What an HTTP server's instrumentation (otelhttp) does per request.
	rctx, request := tp.Tracer("http").Start(ctx, "POST /orders")
	tx := st.Begin(rctx)
	if _, err := ob.PublishTx(rctx, tx, outbox.Envelope{Type: "order.placed", JSON: []byte(`{"id":1}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	request.End()
	if err := st.Drain(ctx, ob); err != nil {
		panic(err)
	}

	ended := spans.GetSpans()
	slices.SortFunc(ended, func(a, b tracetest.SpanStub) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range ended {
		fmt.Printf("%s (%s), same trace: %v, links: %d\n", s.Name, s.SpanKind, s.SpanContext.TraceID() == request.SpanContext().TraceID(), len(s.Links))
	}
	// Output:
	// handler: traceparent in the headers: true
	// POST /orders (internal), same trace: true, links: 0
	// process mailer (consumer), same trace: true, links: 1
	// publish order.placed (producer), same trace: true, links: 0
}
