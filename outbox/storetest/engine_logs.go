package storetest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Engine cases: what reaches the logs.

// Neither payloads nor header values ever reach the logs, on any path:
// hot, dropped, cold, retry, dead, undecodable, invalid.
func testSentinel(t *testing.T, e *env) {
	const sentinel = "S3NT1NEL-PII"
	cfg := fastConfig()
	cfg.HotQueueSize = 1
	cfg.MaxAttempts = 2
	ob := e.outbox(t, cfg)
	var failures sync.WaitGroup
	failures.Add(2)
	ob.Handle("listener-10", func(context.Context, outbox.Event) error { failures.Done(); return errAlwaysFails }, "Fails")
	rec := newRecorder(5)
	ob.Handle("listener-11", rec.listen, typeA)
	headers := map[string]string{"X-Secret": sentinel}
	body := []byte(`{"email":"` + sentinel + `"}`)
	for range 5 { // not started: all but the first drop to the poller
		e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: body, Headers: headers})
	}
	e.publish(t, ob, outbox.Envelope{Type: "Fails", Bytes: body, Headers: headers})
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := &driver.Row{ID: outbox.NewID(), Type: "Bad", Headers: []byte(`{"X-Secret": "` + sentinel), Payload: body, PayloadJSON: true, OccurredAt: time.Now()}
	if err := e.store.Insert(ctx, tx, bad, "", 0); err != nil {
		t.Fatal(err)
	}
	for _, env := range []outbox.Envelope{
		{Type: typeA, JSON: []byte(`{"email":"` + sentinel + `"`)},
		{Type: typeA, JSON: body, Headers: map[string]string{"k": sentinel + "\n"}},
	} {
		if _, err := ob.PublishTx(ctx, tx, env); err == nil || strings.Contains(err.Error(), sentinel) {
			t.Fatalf("invalid envelope: err %v", err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	start(t, ob)
	rec.wait(t, wait)
	waitGroup(t, &failures, "the failing listener's attempts")
	closeNow(t, ob)
	e.wantStatus(t, bad.ID, outbox.StatusDead)
	logs := e.logs.String()
	for _, must := range []string{"hot queue full", "will retry", "event is dead", "cannot be decoded"} {
		if !strings.Contains(logs, must) {
			t.Errorf("no %q log line: that path was not exercised", must)
		}
	}
	if strings.Contains(logs, sentinel) {
		t.Fatalf("the sentinel leaked into the logs:\n%s", logs)
	}
}
