package amqpoutbox_test

import (
	"context"
	"testing"
	"time"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkPublish publishes batches of 100 small events and waits for
// their confirms (a non-durable queue: the broker's disk is not in it).
func BenchmarkPublish(b *testing.B) {
	tp := newTopology(b, "#")
	pub := newPublisher(b, amqpoutbox.Config{URL: tp.url, Exchange: tp.exchange})
	evs := make([]outbox.Event, 100)
	for i := range evs {
		evs[i] = outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "bench", OccurredAt: time.Now(), JSON: []byte(`{"id":42,"item":"book"}`)}, Attempt: 1}
	}
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if err := pub.Publish(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(evs))/b.Elapsed().Seconds(), "events/s")
	b.StopTimer()
	tp.ch.QueuePurge(tp.queue, false)
}
