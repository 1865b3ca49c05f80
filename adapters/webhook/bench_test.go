package webhook_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkDeliver measures commit-to-verified-receipt throughput: events
// published 100 per transaction on SQLite, posted to a local receiver
// that verifies every signature (Handler, Concurrency 8).
//
//	go test -run '^$' -bench Deliver -benchtime 3000x
func BenchmarkDeliver(b *testing.B) {
	secret := webhook.NewSecret()
	rcv := newReceiver(b, secret)
	pub, err := webhook.New(webhook.Config{URL: rcv.URL(), Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	f := start(b, outbox.Subscription{Name: uniqueName("bench"), Handler: pub.Handler(), Concurrency: 8})
	b.ResetTimer()
	start := time.Now()
	for n := 0; n < b.N; {
		k := min(100, b.N-n)
		envs := make([]outbox.Envelope, k)
		for i := range envs {
			envs[i] = outbox.Envelope{Type: "bench", JSON: fmt.Appendf(nil, `{"n":%d}`, n+i)}
		}
		f.publish(envs...)
		n += k
	}
	rcv.waitStored(b, b.N, time.Minute)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}
