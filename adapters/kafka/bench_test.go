package kafkaoutbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkDeliver measures events from commit to Kafka's acknowledgement:
// SQLite outbox, one batch subscription, in-process kfake, 200-byte JSON
// payloads published 100 per transaction.
func BenchmarkDeliver(b *testing.B) {
	c := cluster(b)
	topic := topicName(b)
	createTopic(b, c, topic, nil)
	pub := publisher(b, client(b, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	e := newEngine(b, outbox.Subscription{Name: "to-kafka", Batch: pub.Handler(), BatchSize: 500},
		outbox.Config{PollInterval: 50 * time.Millisecond})
	payload := fmt.Appendf(nil, `{"pad":%q}`, strings.Repeat("x", 190))
	b.ResetTimer()
	start := time.Now()
	for sent := 0; sent < b.N; {
		n := min(100, b.N-sent)
		envs := make([]outbox.Envelope, n)
		for i := range envs {
			envs[i] = outbox.Envelope{Type: "Tick", AggregateID: fmt.Sprint((sent + i) % 64), JSON: payload}
		}
		e.publish(b, true, envs...)
		sent += n
	}
	for endOffset(b, c, topic) < int64(b.N) {
		time.Sleep(5 * time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}
