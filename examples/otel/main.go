// Command otel follows one HTTP request's trace through the outbox to a
// NATS subscriber: a chi service on SQLite publishes order.placed in the
// request's transaction (txmw), oteloutbox traces the publication and
// the delivery, natsoutbox delivers the event to JetStream, and a NATS
// subscriber continues the trace from the message's traceparent header.
//
//	go run . -once # one request to itself, then exit; NATS at NATS_URL (default nats://127.0.0.1:4222)
//	go run .       # serve on 127.0.0.1:8080 until Ctrl-C; see README.md for curl
//
// The spans go to standard output through the OpenTelemetry SDK's stdout
// exporter: the request's server span, "publish order.placed" (its
// child), "process to-nats" (linked to the publish span) and the
// subscriber's "handle order.placed", all in the request's trace. The
// program creates (or updates) the stream EXAMPLE_OTEL on the subjects
// "example.otel.>".
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	_ "modernc.org/sqlite" // driver "sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	oteloutbox "github.com/txoutbox/txoutbox/adapters/otel"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/txmw"
)

// The stream and subjects the example uses.
const (
	stream  = "EXAMPLE_OTEL"
	subject = "example.otel.{type}" // order.placed → example.otel.order.placed
)

func main() {
	natsURL := flag.String("nats", cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), "NATS server URL (JetStream enabled); defaults to $NATS_URL")
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP listen address")
	once := flag.Bool("once", false, "send one POST /orders/1 to the service itself, wait for its NATS message, exit")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, options{natsURL: *natsURL, addr: *addr, once: *once, out: os.Stdout, spans: os.Stdout}); err != nil {
		log.Fatal(err)
	}
}

type options struct {
	natsURL string
	addr    string    // HTTP listen address; "127.0.0.1:0" picks a free port
	once    bool      // one round trip, then return
	out     io.Writer // what the program and the subscriber print
	spans   io.Writer // the stdout exporter's JSON spans
}

// roundTrip is what -once saw: the trace of its request and the message
// the NATS subscriber received.
type roundTrip struct {
	eventID     string
	traceID     string // the request's trace id
	traceparent string // the message's traceparent header
}

func run(ctx context.Context, o options) (*roundTrip, error) {
	// Tracing: an SDK TracerProvider that prints every span when it ends.
	// A real service exports with OTLP instead (otlptracehttp) and usually
	// installs it with otel.SetTracerProvider; oteloutbox.New() then finds
	// it without WithTracerProvider.
	exp, err := stdouttrace.New(stdouttrace.WithWriter(o.spans), stdouttrace.WithPrettyPrint())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "orders"))),
	)
	defer tp.Shutdown(context.WithoutCancel(ctx))
	propagator := propagation.TraceContext{} // W3C traceparent/tracestate

	// The service's database (SQLite in a temporary directory) with its
	// orders and the outbox table.
	dir, err := os.MkdirTemp("", "txoutbox-otel")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		return nil, err
	}
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}

	// The outbox, traced: a "publish <type>" span at Publish, whose
	// context goes into the event's headers, and a "process <subscription>"
	// span around every delivery.
	ob, err := outbox.New(store, outbox.Config{
		Interceptors: []outbox.Interceptor{oteloutbox.New(oteloutbox.WithTracerProvider(tp))},
	})
	if err != nil {
		return nil, err
	}

	// NATS JetStream, and the connector: it copies the event's headers,
	// traceparent among them, onto the message.
	nc, err := nats.Connect(o.natsURL, nats.Name("txoutbox otel example"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", o.natsURL, err)
	}
	defer nc.Drain() // after ob.Close (deferred later, runs first)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{"example.otel.>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: natsoutbox.RetrySpan(outbox.Subscription{}, ob.Config()) + time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("create the stream %s: %w", stream, err)
	}
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: subject, ShortWindow: natsoutbox.WindowRefuse})
	if err != nil {
		return nil, err
	}
	toNATS := outbox.Subscription{Name: "to-nats", Batch: pub.Handler()}
	if err := pub.Check(ctx, toNATS, ob.Config()); err != nil { // the stream's duplicate window covers the retries
		return nil, err
	}
	if err := ob.Subscribe(toNATS); err != nil {
		return nil, err
	}

	// The other side: a NATS subscriber (another service, usually).
	msgs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("example.otel.>", msgs)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil { // the subscription is in place before any event
		return nil, err
	}
	consume := func(msg *nats.Msg) (traceparent string) {
		// Continue the request's trace from the message's headers.
		h := msg.Header
		cctx := propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": h.Get("traceparent"), "tracestate": h.Get("tracestate")})
		_, span := tp.Tracer("subscriber").Start(cctx, "handle "+h.Get("txoutbox-type"), trace.WithSpanKind(trace.SpanKindConsumer))
		defer span.End()
		fmt.Fprintf(o.out, "NATS subscriber: %s %s\n", msg.Subject, msg.Data)
		for _, k := range []string{"txoutbox-id", "txoutbox-type", "traceparent", "tracestate"} {
			fmt.Fprintf(o.out, "  %s: %s\n", k, h.Get(k))
		}
		fmt.Fprintf(o.out, "  its span %q is in trace %s\n", "handle "+h.Get("txoutbox-type"), span.SpanContext().TraceID())
		return h.Get("traceparent")
	}

	// Start's context must outlive the signal: cancelling it stops the
	// engine without draining (and is logged as an error); Close stops it.
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	closeOutbox := func() error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return ob.Close(ctx)
	}
	defer closeOutbox() // a second Close is a no-op

	// The HTTP service: a server span per request (what otelhttp does),
	// then one transaction per request (txmw); the handler writes the
	// order and publishes its event in it.
	r := chi.NewRouter()
	r.Use(serverSpans(tp, propagator), txmw.Transactional(db, middleware.WithOutbox(ob)))
	r.Post("/orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		ctx, id := r.Context(), chi.URLParam(r, "id")
		if _, err := txmw.Tx(ctx).ExecContext(ctx, `INSERT INTO orders (id, item) VALUES (?, 'book')`, id); err != nil {
			http.Error(w, "order exists", http.StatusConflict) // rolled back: nothing published
			return
		}
		eventID, err := outbox.Publish(ctx, outbox.Envelope{
			Type: "order.placed", AggregateType: "order", AggregateID: id, JSON: []byte(`{"item":"book"}`),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated) // commit; then the event goes to NATS
		json.NewEncoder(w).Encode(map[string]string{"event": eventID, "trace": trace.SpanContextFromContext(ctx).TraceID().String()})
	})
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Shutdown(context.WithoutCancel(ctx)) // before the outbox closes
	base := "http://" + ln.Addr().String()

	if !o.once {
		fmt.Fprintf(o.out, "listening on %s; try:\n  curl -i -X POST -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' %s/orders/1\n", base, base)
		for {
			select {
			case msg := <-msgs:
				consume(msg)
			case <-ctx.Done():
				return nil, nil
			}
		}
	}

	// -once: the client's side of one request, in a span of its own whose
	// context goes in the request's traceparent header.
	cctx, span := tp.Tracer("client").Start(ctx, "POST /orders/{id}", trace.WithSpanKind(trace.SpanKindClient))
	traceID := span.SpanContext().TraceID().String()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, base+"/orders/1", nil)
	if err != nil {
		span.End()
		return nil, err
	}
	propagator.Inject(cctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	span.End()
	if err != nil {
		return nil, err
	}
	var created struct{ Event, Trace string }
	err = json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || err != nil {
		return nil, fmt.Errorf("POST /orders/1: %s (%v)", resp.Status, err)
	}
	fmt.Fprintf(o.out, "POST /orders/1: %s, event %s, trace %s\n", resp.Status, created.Event, created.Trace)

	// Wait for the event on the subscriber.
	timeout := time.After(10 * time.Second)
	for {
		select {
		case msg := <-msgs:
			if msg.Header.Get("txoutbox-id") != created.Event {
				continue
			}
			// Close the outbox first, so that the delivery's process span
			// has ended (and is printed) before the subscriber's output.
			if err := closeOutbox(); err != nil {
				return nil, err
			}
			rt := &roundTrip{eventID: created.Event, traceID: traceID, traceparent: consume(msg)}
			got, _ := traceOf(rt.traceparent)
			if got != traceID {
				return rt, fmt.Errorf("the message's traceparent %q is not in the request's trace %s", rt.traceparent, traceID)
			}
			fmt.Fprintf(o.out, "one trace from the HTTP request to the NATS subscriber: %s\n", traceID)
			return rt, nil
		case <-timeout:
			return nil, fmt.Errorf("event %s not received on NATS within 10s", created.Event)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// serverSpans continues the caller's trace from the request's headers in
// a span of kind Server, as otelhttp.NewHandler does.
func serverSpans(tp trace.TracerProvider, p propagation.TextMapPropagator) func(http.Handler) http.Handler {
	tracer := tp.Tracer("http")
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := p.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			ctx, span := tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
			defer span.End()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}

// traceOf returns the trace id of a W3C traceparent header
// (00-<trace id>-<parent id>-<flags>).
func traceOf(traceparent string) (string, error) {
	if len(traceparent) != 55 || traceparent[2] != '-' || traceparent[35] != '-' || traceparent[52] != '-' {
		return "", errors.New("not a traceparent")
	}
	return traceparent[3:35], nil
}
