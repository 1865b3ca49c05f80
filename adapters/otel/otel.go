// Package oteloutbox carries OpenTelemetry traces through the outbox: at
// Publish, the request's W3C trace context (traceparent, tracestate) is
// stored in the event's headers, under a span "publish <type>"; each
// delivery attempt is a span "process <subscription>" linked to it; and
// since every connector copies the event's headers onto the broker's
// message, a consumer that extracts the context continues the request's
// trace.
//
//	ob, err := outbox.New(store, outbox.Config{
//		Interceptors: []outbox.Interceptor{oteloutbox.New()},
//	})
//
// Spans follow the OpenTelemetry semantic conventions for messaging
// (messaging.system "txoutbox"); see the README for the attributes.
package oteloutbox

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/txoutbox/txoutbox/outbox"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/txoutbox/txoutbox/adapters/otel"

// System is the value of messaging.system.
const System = "txoutbox"

// Attributes of the spans beyond the semantic conventions.
const (
	// AttemptKey is the delivery attempt of the event (1 for the first),
	// on process spans of one event.
	AttemptKey = attribute.Key("txoutbox.attempt")
	// PathKey says how the event reached the engine: "hot" (handed over
	// at commit) or "cold" (found by the poller), on process spans of one
	// event.
	PathKey = attribute.Key("txoutbox.path")
	// UnavailableKey is true on a process span whose handler reported its
	// destination unavailable (no attempt spent: outbox.Unavailable).
	UnavailableKey = attribute.Key("txoutbox.unavailable")
	// AggregateTypeKey is the event's aggregate type, when it has one.
	AggregateTypeKey = attribute.Key("txoutbox.aggregate_type")
)

// Option configures New.
type Option func(*Interceptor)

// WithTracerProvider sets where the spans go. Defaults to
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(i *Interceptor) { i.tp = tp }
}

// WithPropagator sets how the trace context is written into and read
// from the event's headers. Defaults to the W3C Trace Context
// (propagation.TraceContext: traceparent and tracestate); pass
// otel.GetTextMapPropagator() to use the process's own (with baggage,
// for instance).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(i *Interceptor) { i.prop = p }
}

// WithoutPublishSpan stores the publisher's own span context in the
// headers instead of starting a "publish <type>" span for each event.
func WithoutPublishSpan() Option {
	return func(i *Interceptor) { i.noPublishSpan = true }
}

// WithLinksOnly makes every process span the root of a trace of its own,
// linked to the publish span, as the messaging conventions recommend for
// consumers that may run long after the producer. By default the process
// span of a single event (a Handler or Tx call, or a batch of one) is a
// child of its publish span, so that the request and its deliveries form
// one trace; a batch's span is always a root with a link per event.
func WithLinksOnly() Option {
	return func(i *Interceptor) { i.linksOnly = true }
}

// Interceptor is the outbox.Interceptor that traces publications and
// deliveries. Make one with New.
type Interceptor struct {
	tp            trace.TracerProvider
	prop          propagation.TextMapPropagator
	noPublishSpan bool
	linksOnly     bool
	tracer        trace.Tracer
}

var _ outbox.Interceptor = (*Interceptor)(nil)

// New returns the interceptor; put it in outbox.Config.Interceptors.
func New(opts ...Option) *Interceptor {
	i := &Interceptor{}
	for _, o := range opts {
		o(i)
	}
	if i.tp == nil {
		i.tp = otel.GetTracerProvider()
	}
	if i.prop == nil {
		i.prop = propagation.TraceContext{}
	}
	i.tracer = i.tp.Tracer(ScopeName)
	return i
}

// Publish starts and ends the span "publish <type>" (kind Producer) as a
// child of the span in ctx, and stores its context in env.Headers. With
// WithoutPublishSpan it stores the context of ctx itself. Headers the
// propagator writes replace any of the same name.
func (i *Interceptor) Publish(ctx context.Context, env *outbox.Envelope) {
	if !i.noPublishSpan {
		attrs := []attribute.KeyValue{
			semconv.MessagingSystemKey.String(System),
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"),
			semconv.MessagingDestinationName(string(env.Type)),
			semconv.MessagingMessageID(env.ID),
			semconv.MessagingMessageBodySize(len(env.Payload())),
		}
		if env.AggregateType != "" {
			attrs = append(attrs, AggregateTypeKey.String(string(env.AggregateType)))
		}
		var span trace.Span
		ctx, span = i.tracer.Start(ctx, "publish "+string(env.Type),
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		defer span.End()
	}
	i.prop.Inject(ctx, propagation.MapCarrier(env.Headers))
}

// Deliver runs next in the span "process <subscription>" (kind Consumer),
// linked to the publish span of each event it delivers (found in the
// events' headers). The span of a single event is the child of its
// publish span unless WithLinksOnly; a batch's is a new root. A failed
// call sets the span's status to Error with error.type; a panic is
// recorded and passed on.
func (i *Interceptor) Deliver(ctx context.Context, sub string, evs []outbox.Event, next func(context.Context) error) (err error) {
	links := make([]trace.Link, 0, len(evs))
	var parent context.Context
	for _, ev := range evs {
		pctx := i.prop.Extract(ctx, propagation.MapCarrier(ev.Headers))
		sc := trace.SpanContextFromContext(pctx)
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{semconv.MessagingMessageID(ev.ID)}})
		if len(evs) == 1 && !i.linksOnly {
			parent = pctx
		}
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(System),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationSubscriptionName(sub),
		semconv.MessagingConsumerGroupName(sub),
	}
	if len(evs) == 1 {
		ev := &evs[0]
		attrs = append(attrs,
			semconv.MessagingDestinationName(string(ev.Type)),
			semconv.MessagingMessageID(ev.ID),
			semconv.MessagingMessageBodySize(len(ev.Payload())),
			AttemptKey.Int(ev.Attempt),
			PathKey.String(string(ev.Path)),
		)
		if ev.AggregateType != "" {
			attrs = append(attrs, AggregateTypeKey.String(string(ev.AggregateType)))
		}
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(evs)))
		if t, same := oneType(evs); same {
			attrs = append(attrs, semconv.MessagingDestinationName(string(t)))
		}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...), trace.WithLinks(links...)}
	if parent == nil {
		parent = ctx
		opts = append(opts, trace.WithNewRoot())
	}
	// parent derives from ctx: the handler gets the call's deadline and
	// cancellation, with the process span (and any extracted baggage).
	sctx, span := i.tracer.Start(parent, "process "+sub, opts...)
	defer func() {
		if v := recover(); v != nil {
			span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", v))
			span.SetAttributes(semconv.ErrorTypeKey.String("panic"))
			span.End()
			panic(v)
		}
		span.End()
	}()
	err = next(sctx)
	if err != nil {
		if down, _ := outbox.IsUnavailable(err); down {
			span.SetAttributes(UnavailableKey.Bool(true))
		}
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorType(err))
	}
	return err
}

// oneType returns the type of the events if they all have the same.
func oneType(evs []outbox.Event) (outbox.EventType, bool) {
	if len(evs) == 0 {
		return "", false
	}
	for _, ev := range evs[1:] {
		if ev.Type != evs[0].Type {
			return "", false
		}
	}
	return evs[0].Type, true
}
