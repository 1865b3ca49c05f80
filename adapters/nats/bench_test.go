package natsoutbox_test

import (
	"context"
	"testing"
	"time"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkHandler publishes batches of 100 events straight through the
// handler (async publishes, then the acks), to a memory stream.
func BenchmarkHandler(b *testing.B) {
	_, js := connect(b, testbroker.NATS(b))
	ts := newStream(b, js, nil)
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		b.Fatal(err)
	}
	evs := make([]outbox.Event, 100)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		for i := range evs {
			evs[i] = outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "bench", JSON: jsonPayload(i), Headers: map[string]string{"traceparent": traceparent}}}
		}
		if err := pub.Publish(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkOutboxToNATS measures events from commit (transactions of 100
// events, SQLite) to stored in the stream.
func BenchmarkOutboxToNATS(b *testing.B) {
	_, js := connect(b, testbroker.NATS(b))
	ts := newStream(b, js, nil)
	pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: ts.prefix + ".{type}"})
	if err != nil {
		b.Fatal(err)
	}
	e := newOutbox(b, outbox.Config{})
	if err := pub.Subscribe(context.Background(), e.ob, outbox.Subscription{Name: "to-nats"}); err != nil {
		b.Fatal(err)
	}
	e.start(b)
	envs := make([]outbox.Envelope, 100)
	for i := range envs {
		envs[i] = outbox.Envelope{Type: "bench", JSON: jsonPayload(i)}
	}
	start := time.Now()
	n := 0
	for b.Loop() {
		e.publish(b, true, envs...)
		n += len(envs)
	}
	ts.waitCount(b, uint64(n), time.Minute) // until the last one is stored
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "events/s")
}
