package redisoutbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkPublish measures the connector alone: batches of 100 events of
// 200 bytes to one stream, in each mode (ns/op is per event).
func BenchmarkPublish(b *testing.B) {
	for _, idem := range []bool{false, true} {
		name := "default"
		if idem {
			name = "idempotent"
		}
		b.Run(name, func(b *testing.B) {
			rdb := newClient(b, testbroker.Redis(b))
			stream := prefix(b, rdb) + "events"
			cfg := redisoutbox.Config{Stream: stream, MaxLen: 10000}
			if idem {
				cfg.IdempotentTTL = time.Minute
			}
			pub, err := redisoutbox.New(rdb, cfg)
			if err != nil {
				b.Fatal(err)
			}
			h := pub.Handler()
			payload := make([]byte, 200)
			evs := make([]outbox.Event, 100)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i += len(evs) {
				for j := range evs {
					evs[j] = outbox.Event{Envelope: outbox.Envelope{ID: strconv.Itoa(i + j), Type: "T", OccurredAt: time.Now(), Bytes: payload}}
				}
				if err := h(ctx, evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
