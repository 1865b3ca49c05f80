package oteloutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// One HTTP request publishes an order; natsoutbox delivers it to a
// JetStream stream: the spans form one trace from the caller's request to
// the delivery, and the message on the stream carries the request's trace
// id in traceparent, for the consumer to continue.
func TestHTTPRequestToNATS(t *testing.T) {
	nc, err := nats.Connect(testbroker.NATS(t), nats.Timeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := outbox.NewID()
	name, prefix := "TXO_OTEL_"+id, "txootel"+strings.ToLower(id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage, Duplicates: 10 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream: %v", err)
		}
	})

	a := newApp(t, func(ob *outbox.Outbox) {
		pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: prefix + ".{type}"})
		if err != nil {
			t.Fatal(err)
		}
		sub := outbox.Subscription{Name: "to-nats", Batch: pub.Handler()}
		if err := pub.Check(ctx, sub, ob.Config()); err != nil {
			t.Fatal(err)
		}
		if err := ob.Subscribe(sub); err != nil {
			t.Fatal(err)
		}
	})
	a.order(t)

	// The consumer reads the message from the stream.
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no message on the stream: %v", err)
	}
	if msg.Subject() != prefix+".order.placed" {
		t.Errorf("subject %q", msg.Subject())
	}
	a.checkTrace(t, "to-nats", msg.Headers().Get)
}
