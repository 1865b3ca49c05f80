package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

const (
	typeA   outbox.EventType = "A"
	typeB   outbox.EventType = "B"
	wait                     = 20 * time.Second
	payload                  = `{"order":"42"}`
)

// 18.1: a rolled-back transaction leaves no row, fires no listener and
// counts in no metric.
func testAtomicity(t *testing.T, e *env) {
	cfg := fastConfig()
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	rec := newRecorder(1)
	ob.Handle("all", rec.listen)
	start(t, ob)
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.(driver.Inspector).Inspect(ctx, rolledBack); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Inspect rolled-back event: err = %v, want ErrNotFound", err)
	}
	if n := m.published.Load(); n != 0 {
		t.Fatalf("Metrics.Published called %d times for a rolled-back event, want 0", n)
	}
	// A committed event after it is delivered; the rolled-back one never.
	committed := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	rec.wait(t, wait)
	closeNow(t, ob)
	counts, _ := rec.snapshot()
	if counts[rolledBack] != 0 || counts[committed] != 1 {
		t.Fatalf("deliveries = %v; want only %s once", counts, committed)
	}
	if n := m.published.Load(); n != 1 {
		t.Fatalf("Metrics.Published called %d times, want 1 (the committed event)", n)
	}
	e.wantDelivered(t, 1)
}

// 18.2: after commit the event goes through the hot path and is DONE.
func testCommitHotPath(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true // only the hot path can deliver
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	got := make(chan outbox.Event, 1)
	ob.Handle("listener-1", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, typeA)
	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42"})
	ev := recv(t, got, "hot delivery")
	if ev.ID != id || ev.Path != outbox.PathHot || ev.Attempt != 1 || string(ev.JSON) != payload || ev.AggregateID != "42" {
		t.Fatalf("delivered %+v; want id %s on the hot path, attempt 1, the published payload", ev, id)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
	if m.hotEnqueued.Load() != 1 || m.published.Load() != 1 || m.outcome(outbox.OutcomeDone) != 1 {
		t.Fatalf("metrics: published %d, hot enqueued %d, done %d; want 1 each", m.published.Load(), m.hotEnqueued.Load(), m.outcome(outbox.OutcomeDone))
	}
}

// 18.3: a full hot queue never fails Publish; the rows stay NEW and the
// poller delivers them all.
func testHotQueueFull(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.HotQueueSize = 1
	cfg.Workers = 1
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	const n = 20
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	// Not started: nothing drains the hot queue, so all but one drop.
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	if got := m.hotDropped.Load(); got != n-1 {
		t.Fatalf("hot dropped = %d, want %d", got, n-1)
	}
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusNew)
	}
	if !strings.Contains(e.logs.String(), "hot queue full") {
		t.Fatalf("no warning logged for the full hot queue; logs:\n%s", e.logs)
	}
	start(t, ob)
	rec.wait(t, wait)
	closeNow(t, ob)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if m.coldEnqueued.Load() < n-1 {
		t.Fatalf("cold enqueued = %d, want at least %d", m.coldEnqueued.Load(), n-1)
	}
}

// A transaction that commits more than half a lease after publishing may
// find its lease expired and another instance entitled to the event: the
// hot path stays out and the event is delivered once, by a poller.
func testLateCommitLeftToPoller(t *testing.T, e *env) {
	const lease = 200 * time.Millisecond
	rec := newRecorder(1)
	var obs []*outbox.Outbox
	var ms []*counting
	for range 2 {
		cfg := fastConfig()
		cfg.Lease = lease
		m := &counting{}
		cfg.Metrics = m
		ob := e.outbox(t, cfg)
		ob.Handle("all", rec.listen)
		start(t, ob)
		obs, ms = append(obs, ob), append(ms, m)
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	id, err := obs[0].PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		tx.Rollback()
		t.Fatalf("PublishTx: %v", err)
	}
	// The transaction stays open past the whole lease. Elapsed time is the
	// condition under test: there is no signal to wait for instead.
	time.Sleep(lease + lease/2)
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	rec.wait(t, wait)
	for _, ob := range obs {
		closeNow(t, ob) // delivers anything still queued: a duplicate would show
	}
	e.wantStatus(t, id, outbox.StatusDone)
	counts, events := rec.snapshot()
	if counts[id] != 1 || events[0].Path != outbox.PathCold {
		t.Fatalf("delivered %d times, first on the %v path; want once, by a poller", counts[id], events[0].Path)
	}
	if got, hot := ms[0].hotDropped.Load(), ms[0].hotEnqueued.Load(); got != 1 || hot != 0 {
		t.Fatalf("publisher: hot dropped %d, hot enqueued %d; want 1 and 0", got, hot)
	}
	if !strings.Contains(e.logs.String(), "committed late") {
		t.Fatalf("no warning logged for the late commit; logs:\n%s", e.logs)
	}
}

// 18.4: a failing listener makes the event RETRY with growing attempts,
// then DEAD after MaxAttempts, with last_error capped at 4000 characters.
func testRetryThenDead(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.MaxAttempts = 3
	const backoff = 60 * time.Millisecond
	cfg.Retry = outbox.RetryFunc(func(failures int) time.Duration { return backoff })
	ob := e.outbox(t, cfg)
	type attempt struct {
		n     int
		start time.Time
	}
	attempts := make(chan attempt, 10)
	var lastEnd atomic.Int64
	gate := make(chan struct{})       // holds attempt 2 while the row is inspected
	long := strings.Repeat("é", 5000) // multi-byte: truncation must respect characters
	ob.Handle("listener-2", func(_ context.Context, ev outbox.Event) error {
		attempts <- attempt{ev.Attempt, time.Now()}
		if ev.Attempt == 2 {
			<-gate
		}
		lastEnd.Store(time.Now().UnixNano())
		return errors.New(long)
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	first := recv(t, attempts, "attempt 1")
	firstEnd := time.Unix(0, lastEnd.Load())
	second := recv(t, attempts, "attempt 2")
	if first.n != 1 || second.n != 2 {
		t.Fatalf("attempt numbers %d, %d; want 1, 2", first.n, second.n)
	}
	if gap := second.start.Sub(firstEnd); gap < backoff/2 {
		t.Fatalf("attempt 2 started %v after attempt 1 failed; the back-off is %v", gap, backoff)
	}
	// While attempt 2 runs, the row shows the first failure.
	rec := e.wantStatus(t, id, outbox.StatusRetry)
	if rec.Attempts != 1 {
		t.Fatalf("after one failure: status %v attempts %d, want retry 1", rec.Status, rec.Attempts)
	}
	if n := len([]rune(rec.LastError)); n > outbox.MaxErrorChars || n < 1000 {
		t.Fatalf("last_error has %d characters, want at most %d and the error's start", n, outbox.MaxErrorChars)
	}
	close(gate)
	if third := recv(t, attempts, "attempt 3"); third.n != 3 {
		t.Fatalf("attempt %d, want 3", third.n)
	}
	closeNow(t, ob)
	rec = e.wantStatus(t, id, outbox.StatusDead)
	if rec.Attempts != 3 {
		t.Fatalf("dead after %d attempts, want 3", rec.Attempts)
	}
	if n := len([]rune(rec.LastError)); n != outbox.MaxErrorChars {
		t.Fatalf("last_error has %d characters, want %d", n, outbox.MaxErrorChars)
	}
	select {
	case a := <-attempts:
		t.Fatalf("attempt %d after the event went dead", a.n)
	default:
	}
}

const (
	orderPlaced outbox.EventType     = "OrderPlaced"
	orderAgg    outbox.AggregateType = "order"
)

// 18.5 and 18.6: typed event and aggregate types round-trip on both paths.
func testTyped(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	got := make(chan outbox.Event, 2)
	ob.Handle("listener-3", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, orderPlaced)
	start(t, ob)
	when := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	e.publish(t, ob, outbox.Envelope{Type: orderPlaced, AggregateType: orderAgg, AggregateID: "o-1", TenantID: "t-1", OccurredAt: when, JSON: []byte(payload)})
	hot := recv(t, got, "hot delivery")
	cold := e.outbox(t, outbox.Config{DisableHotPath: true})
	e.publish(t, cold, outbox.Envelope{Type: orderPlaced, AggregateType: orderAgg, AggregateID: "o-1", TenantID: "t-1", OccurredAt: when, JSON: []byte(payload)})
	polled := recv(t, got, "cold delivery")
	for _, ev := range []outbox.Event{hot, polled} {
		if ev.Type != orderPlaced || ev.AggregateType != orderAgg || ev.AggregateType.String() != "order" || ev.AggregateID != "o-1" || ev.TenantID != "t-1" || !ev.OccurredAt.Equal(when) {
			t.Fatalf("%s path delivered %+v", ev.Path, ev.Envelope)
		}
	}
	if hot.Path != outbox.PathHot || polled.Path != outbox.PathCold {
		t.Fatalf("paths %s, %s; want hot, cold", hot.Path, polled.Path)
	}
}

// Publish without a transaction fails fast and writes nothing.
func testNoTx(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	_, err := ob.Publish(context.Background(), outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if !errors.Is(err, outbox.ErrNoTx) || !strings.Contains(err.Error(), "PublishTx") {
		t.Fatalf("Publish without tx: %v; want ErrNoTx saying how to fix it", err)
	}
	if _, err := outbox.Publish(context.Background(), outbox.Envelope{Type: typeA, JSON: []byte(payload)}); outbox.Default() == nil && !errors.Is(err, outbox.ErrNoOutbox) {
		t.Fatalf("package Publish without outbox: %v; want ErrNoOutbox", err)
	}
	ctx := outbox.NewContext(context.Background(), ob)
	if _, err := outbox.Publish(ctx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("package Publish with outbox, without tx: %v; want ErrNoTx", err)
	}
	if s := e.stats(t); s.New != 0 {
		t.Fatalf("rows written: %+v", s)
	}
}

// Invalid envelopes are rejected with an error naming the field, the
// payload is never echoed, and nothing is written.
func testInvalid(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	secret := "SECRET-PAYLOAD-TEXT"
	cases := []struct {
		env   outbox.Envelope
		field string
	}{
		{outbox.Envelope{JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA}, "JSON"},
		{outbox.Envelope{Type: typeA, JSON: []byte("{}"), Bytes: []byte("x")}, "JSON"},
		{outbox.Envelope{Type: typeA, JSON: []byte(`{"a":"` + secret + `"`)}, "JSON"},
		{outbox.Envelope{Type: typeA, Bytes: make([]byte, outbox.MaxPayloadBytes+1)}, "Bytes"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"bad key": "v"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\r\nInjected: 1"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), ID: strings.Repeat("x", 65)}, "ID"},
		// What a connector refuses (the webhook's HTTP headers) or a
		// terminal obeys is refused at Publish, not found dead later.
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\x1b[31m"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\x7f"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\u0085"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\u2028"}}, "Headers"},
		{outbox.Envelope{Type: typeA + "\u202e", JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA + "\x1b", JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42\u2029"}, "AggregateID"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42\x07"}, "AggregateID"},
	}
	for _, c := range cases {
		_, err := ob.PublishTx(ctx, tx, c.env)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("PublishTx(headers %s, type %q): %v; want a ValidationError for %s", truncated(fmt.Sprintf("%q", c.env.Headers), 80), c.env.Type, err, c.field)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error echoes the payload or header value: %v", err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := e.stats(t); s.New != 0 {
		t.Fatalf("rows written: %+v", s)
	}
}

// A panicking and an always-failing listener go DEAD while 100 healthy
// events are delivered.
func testPanicAndFailing(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.MaxAttempts = 2
	ob := e.outbox(t, cfg)
	const healthy = 100
	rec := newRecorder(healthy)
	ob.Handle("listener-4", rec.listen, "Healthy")
	var badDone sync.WaitGroup
	badDone.Add(4) // two attempts each
	ob.Handle("listener-5", func(context.Context, outbox.Event) error { defer badDone.Done(); panic("listener bug") }, "Panics")
	ob.Handle("listener-6", func(context.Context, outbox.Event) error { defer badDone.Done(); return errAlwaysFails }, "Fails")
	start(t, ob)
	panicky := e.publish(t, ob, outbox.Envelope{Type: "Panics", JSON: []byte(payload)})
	failing := e.publish(t, ob, outbox.Envelope{Type: "Fails", JSON: []byte(payload)})
	ids := e.publishMany(t, ob, "Healthy", healthy)
	rec.wait(t, wait)
	waitGroup(t, &badDone, "the bad listeners' attempts")
	closeNow(t, ob)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if rec := e.wantStatus(t, panicky, outbox.StatusDead); !strings.Contains(rec.LastError, "panicked: listener bug") {
		t.Fatalf("panicking listener's last error %q", rec.LastError)
	}
	if rec := e.wantStatus(t, failing, outbox.StatusDead); !strings.Contains(rec.LastError, errAlwaysFails.Error()) {
		t.Fatalf("failing listener's last error %q", rec.LastError)
	}
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done, what)
}

// An error wrapped with outbox.Permanent is DEAD after one attempt.
func testPermanent(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	called := make(chan struct{}, 5)
	ob.Handle("listener-7", func(context.Context, outbox.Event) error {
		called <- struct{}{}
		return outbox.Permanent(errors.New("malformed order"))
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, called, "the attempt")
	closeNow(t, ob)
	if rec := e.wantStatus(t, id, outbox.StatusDead); rec.Attempts != 1 {
		t.Fatalf("attempts %d, want 1", rec.Attempts)
	}
	if len(called) != 0 {
		t.Fatalf("retried a permanent failure")
	}
}

// A listener that ignores its context is cut by the timeout: the worker
// moves on, the attempt fails, and Close still waits for the call.
func testListenerTimeout(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Workers = 1
	cfg.MaxAttempts = 1
	cfg.ListenerTimeout = 50 * time.Millisecond
	ob := e.outbox(t, cfg)
	entered := make(chan struct{})
	release := make(chan struct{})
	var stuckReturned atomic.Bool
	ob.Handle("listener-8", func(context.Context, outbox.Event) error {
		close(entered)
		<-release
		stuckReturned.Store(true)
		return nil
	}, typeA)

	next := make(chan string, 1)
	ob.Handle("listener-9", func(_ context.Context, ev outbox.Event) error { next <- ev.ID; return nil }, typeB)
	start(t, ob)
	stuck := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, entered, "the stuck listener to start")
	after := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	// One worker: the second event can only be delivered once the worker
	// has given up on the first.
	if got := recv(t, next, "the next event"); got != after {
		t.Fatalf("delivered %s, want %s", got, after)
	}
	closed := make(chan error, 1)
	go func() { closed <- ob.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an abandoned listener call was still running", err)
	default:
	}
	close(release)
	if err := recv(t, closed, "Close"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !stuckReturned.Load() {
		t.Fatal("Close returned before the abandoned call")
	}
	if rec := e.wantStatus(t, stuck, outbox.StatusDead); !strings.Contains(rec.LastError, "did not return within") {
		t.Fatalf("last error %q", rec.LastError)
	}
}

// Close delivers what is queued before it returns.
func testCloseDrains(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 2
	ob := e.outbox(t, cfg)
	const n = 300
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	ids := e.publishMany(t, ob, typeA, n) // queued, not yet started
	start(t, ob)
	closeNow(t, ob)
	counts, _ := rec.snapshot()
	if len(counts) != n {
		t.Fatalf("Close returned after %d of %d queued events", len(counts), n)
	}
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
}

// Close with an expired context cancels the running listener and hands the
// queued events back: NEW, no owner, no attempt counted.
func testCloseHandsBack(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 1
	ob := e.outbox(t, cfg)
	entered := make(chan struct{}, 1)
	ob.Handle("all", func(ctx context.Context, _ outbox.Event) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	})

	ids := e.publishMany(t, ob, typeA, 10)
	start(t, ob)
	recv(t, entered, "the first delivery")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ob.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, id := range ids {
		rec := e.wantStatus(t, id, outbox.StatusNew)
		if rec.Owner != "" || rec.Attempts != 0 {
			t.Fatalf("event %s after Close: owner %q attempts %d; want handed back, no attempt", id, rec.Owner, rec.Attempts)
		}
	}
}

// Close with an expired context reports a listener call that ignores its
// cancelled context instead of waiting for it forever.
func testCloseReportsStuckListener(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.Workers = 1
	ob := e.outbox(t, cfg)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	returned := make(chan struct{})
	ob.Handle("all", func(context.Context, outbox.Event) error {
		defer close(returned)
		entered <- struct{}{}
		<-release
		return nil
	})

	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	start(t, ob)
	recv(t, entered, "the delivery")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := ob.Close(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "ignored their context") {
		t.Fatalf("Close = %v; want an error naming the listener that ignored its context", err)
	}
	close(release)
	recv(t, returned, "the stuck listener to return")
	e.wantStatus(t, id, outbox.StatusNew) // handed back, not lost
}

// Start and Close in any order, repeatedly and concurrently, with
// publishes in flight: no race, no deadlock, no goroutine left.
func testStartCloseStress(t *testing.T, e *env) {
	for range 15 {
		cfg := fastConfig()
		cfg.HotQueueSize = 8
		ob := e.outbox(t, cfg)
		ob.Handle("all", func(context.Context, outbox.Event) error { return nil })
		var wg sync.WaitGroup
		wg.Go(func() { ob.Start(context.Background()) })
		wg.Go(func() { ob.Start(context.Background()) })
		wg.Go(func() {
			for range 5 {
				e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
			}
		})
		wg.Wait()
		wg.Go(func() { ob.Close(context.Background()) })
		wg.Go(func() { ob.Close(context.Background()) })
		wg.Wait()
		if err := ob.Start(context.Background()); !errors.Is(err, outbox.ErrClosed) {
			t.Fatalf("Start after Close: %v, want ErrClosed", err)
		}
	}
	never := e.outbox(t, fastConfig())
	if err := never.Close(context.Background()); err != nil {
		t.Fatalf("Close without Start: %v", err)
	}
}

// Four instances polling one table deliver each of 10,000 events exactly
// once.
func testFourInstances(t *testing.T, e *env) {
	n := 10000
	if raceEnabled && !e.h.ConcurrentWriters {
		// modernc.org/sqlite is C translated to Go: the race detector
		// slows it a hundredfold. `make test` also runs the suite without
		// -race, with the full count.
		n = 2000
		t.Logf("race detector on: %d events instead of 10000 on this store", n)
	}
	producer := e.outbox(t, outbox.Config{DisableHotPath: true})
	ids := e.publishMany(t, producer, typeA, n)
	rec := newRecorder(n)
	var instances []*outbox.Outbox
	metrics := make([]*counting, 4)
	for i := range 4 {
		cfg := fastConfig()
		cfg.PollBatchSize = 200
		metrics[i] = &counting{}
		cfg.Metrics = metrics[i]
		ob := e.outbox(t, cfg)
		ob.Handle("all", rec.listen)
		instances = append(instances, ob)
	}
	for _, ob := range instances {
		start(t, ob)
	}
	rec.wait(t, 90*time.Second)
	for _, ob := range instances {
		closeNow(t, ob)
	}
	counts, _ := rec.snapshot()
	for _, id := range ids {
		if counts[id] != 1 {
			t.Fatalf("event %s delivered %d times, want exactly once", id, counts[id])
		}
	}
	busy := 0
	for _, m := range metrics {
		if m.coldEnqueued.Load() > 0 {
			busy++
		}
	}
	e.wantDelivered(t, int64(n))
	t.Logf("%d of 4 instances took part", busy)
}

// While one instance delivers an event on its hot path, however slowly,
// another instance's poller does not take it.
func testNoSteal(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.DisablePoller = true
	a := e.outbox(t, cfg)
	entered := make(chan struct{})
	release := make(chan struct{})
	a.Handle("all", func(context.Context, outbox.Event) error { close(entered); <-release; return nil })
	start(t, a)
	b := e.outbox(t, fastConfig()) // not started: we poll it by hand
	var stolen atomic.Int64
	b.Handle("all", func(context.Context, outbox.Event) error { stolen.Add(1); return nil })
	id := e.publish(t, a, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, entered, "the hot delivery")
	// b has no skip window at all: a "created more than SkipRecent ago"
	// rule alone would now hand the event to b.
	for range 3 {
		if n, err := b.Poll(context.Background()); err != nil || n != 0 {
			t.Fatalf("second instance's poll took %d events (err %v) while the first delivers", n, err)
		}
	}
	close(release)
	closeNow(t, a)
	closeNow(t, b)
	if rec := e.wantStatus(t, id, outbox.StatusDone); rec.Owner != "" {
		t.Fatalf("owner %q after done", rec.Owner)
	}
	if stolen.Load() != 0 {
		t.Fatal("second instance delivered the event")
	}
}

// A worker whose lease expired and was taken over cannot change the row.
func testZombie(t *testing.T, e *env) {
	ctx := context.Background()
	producer := e.outbox(t, outbox.Config{DisableHotPath: true})
	id := e.publish(t, producer, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	claim := func(owner string, lease time.Duration) []driver.Row {
		rows, err := e.store.Claim(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: lease})
		if err != nil {
			t.Fatalf("Claim(%s): %v", owner, err)
		}
		return rows
	}
	// The zombie's lease must outlast the next claim even on a loaded
	// machine (30 ms did not, once in a full -race run beside other
	// work: the second claim then rightly took the expired row).
	if rows := claim("zombie", time.Second); len(rows) != 1 || rows[0].ID != id {
		t.Fatalf("zombie claimed %v", rows)
	}
	if rows := claim("other", time.Minute); len(rows) != 0 {
		t.Fatalf("claimed a row under a live lease: %v", rows)
	}
	// Wait, on the database's clock, for the zombie's lease to run out.
	deadline := time.Now().Add(wait)
	var taken []driver.Row
	for len(taken) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the expired lease was never taken over")
		}
		time.Sleep(5 * time.Millisecond)
		taken = claim("successor", time.Minute)
	}
	if taken[0].PrevOwner != "zombie" {
		t.Fatalf("PrevOwner %q, want zombie", taken[0].PrevOwner)
	}
	if n, err := e.store.MarkDone(ctx, "zombie", []string{id}, e.registry(t)); err != nil || n != 0 {
		t.Fatalf("zombie MarkDone changed %d rows (err %v)", n, err)
	}
	if ok, err := e.store.MarkRetry(ctx, "zombie", id, 0, "late"); err != nil || ok {
		t.Fatalf("zombie MarkRetry = %v (err %v)", ok, err)
	}
	if ok, err := e.store.MarkDead(ctx, "zombie", id, "late"); err != nil || ok {
		t.Fatalf("zombie MarkDead = %v (err %v)", ok, err)
	}
	if n, err := e.store.ExtendLeases(ctx, "zombie", []string{id}, time.Hour); err != nil || n != 0 {
		t.Fatalf("zombie ExtendLeases = %d (err %v)", n, err)
	}
	if err := e.store.Release(ctx, "zombie", []string{id}, 0); err != nil {
		t.Fatal(err)
	}
	rec := e.wantStatus(t, id, outbox.StatusNew)
	if rec.Owner != "successor" || rec.Attempts != 0 || rec.LastError != "" {
		t.Fatalf("row after the zombie's writes: owner %q attempts %d error %q", rec.Owner, rec.Attempts, rec.LastError)
	}
	if n, err := e.store.MarkDone(ctx, "successor", []string{id}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("successor MarkDone = %d (err %v)", n, err)
	}
	e.wantStatus(t, id, outbox.StatusDone)
}

// The events of an instance that died after commit are delivered by
// another once the lease runs out.
func testTakeover(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Lease = 300 * time.Millisecond
	dead := e.outbox(t, cfg) // never started: it "dies" with events in its hot queue
	dead.Handle("all", func(context.Context, outbox.Event) error { t.Error("the dead instance delivered"); return nil })
	ids := make([]string, 5)
	for i := range ids {
		ids[i] = e.publish(t, dead, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	m := &counting{}
	cfg = fastConfig()
	cfg.Metrics = m
	survivor := e.outbox(t, cfg)
	rec := newRecorder(len(ids))
	survivor.Handle("all", rec.listen)
	start(t, survivor)
	rec.wait(t, wait)
	closeNow(t, survivor)
	for _, id := range ids {
		e.wantStatus(t, id, outbox.StatusDone)
	}
	if m.reclaimed.Load() != int64(len(ids)) {
		t.Fatalf("leases reclaimed = %d, want %d", m.reclaimed.Load(), len(ids))
	}
}

// A transaction that commits after a later one is still delivered: the
// poll is no "id greater than last seen" cursor.
func testLateCommit(t *testing.T, e *env) {
	if !e.h.ConcurrentWriters {
		t.Skip("the store's database does not allow two open write transactions")
	}
	cfg := fastConfig()
	cfg.DisableHotPath = true
	ob := e.outbox(t, cfg)
	got := make(chan string, 2)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil })
	start(t, ob)
	ctx := context.Background()
	slow, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	early, err := ob.PublishTx(ctx, slow, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	later := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if later <= early {
		t.Fatalf("ids not ordered: %s then %s", early, later)
	}
	if id := recv(t, got, "the later event"); id != later {
		t.Fatalf("delivered %s before the early transaction committed", id)
	}
	if err := slow.Commit(); err != nil {
		t.Fatal(err)
	}
	if id := recv(t, got, "the early event"); id != early {
		t.Fatalf("delivered %s, want %s", id, early)
	}
}

// Payloads of exactly 1 MiB, JSON and binary, reach listeners byte-exact on
// the hot and the cold path; one byte more is rejected.
func testPayloadRoundTrip(t *testing.T, e *env) {
	bin := randomBytes(outbox.MaxPayloadBytes)
	bin[0], bin[1] = 0, 0xff // NUL and a byte that is never valid UTF-8
	js := []byte(`"` + strings.Repeat("a", outbox.MaxPayloadBytes-2) + `"`)
	small := []byte("{ \"spaced\" :  [1, 2.50, \"\\u00e9\"] }") // not normalised
	got := make(chan outbox.Event, 6)
	listen := func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }
	hot := e.outbox(t, fastConfig())
	hot.Handle("all", listen)
	start(t, hot)
	coldCfg := fastConfig()
	coldCfg.DisableHotPath = true
	cold := e.outbox(t, coldCfg)
	cold.Handle("all", listen)
	start(t, cold)
	want := map[string][]byte{}
	for _, ob := range []*outbox.Outbox{hot, cold} {
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, Bytes: bin})] = bin
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: js})] = js
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: small})] = small
	}
	paths := map[outbox.Path]int{}
	for range want {
		ev := recv(t, got, "a large event")
		if !bytes.Equal(ev.Payload(), want[ev.ID]) {
			t.Fatalf("%s path: payload of %d bytes differs from the %d published", ev.Path, len(ev.Payload()), len(want[ev.ID]))
		}
		if ev.IsJSON() != (ev.Bytes == nil) {
			t.Fatalf("payload kind lost")
		}
		paths[ev.Path]++
	}
	if paths[outbox.PathHot] != 3 || paths[outbox.PathCold] != 3 {
		t.Fatalf("paths %v, want 3 hot and 3 cold", paths)
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = hot.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, Bytes: make([]byte, outbox.MaxPayloadBytes+1)})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "1048577") || !strings.Contains(err.Error(), "1048576") {
		t.Fatalf("1 MiB + 1: %v; want a ValidationError naming the size and the limit", err)
	}
}

// A stored row that cannot be decoded goes DEAD instead of looping.
func testUndecodable(t *testing.T, e *env) {
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := outbox.NewID()
	row := &driver.Row{ID: id, Type: string(typeA), Headers: []byte(`{"k": 1`), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
	if err := e.store.Insert(ctx, tx, row, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ob := e.outbox(t, fastConfig())
	ob.Handle("all", func(context.Context, outbox.Event) error {
		t.Error("listener called for an undecodable row")
		return nil
	})

	if _, err := ob.Poll(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := e.wantStatus(t, id, outbox.StatusDead); !strings.Contains(rec.LastError, "headers") {
		t.Fatalf("last error %q", rec.LastError)
	}
}

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

// Dead letters can be listed (without payloads) and replayed.
func testReplay(t *testing.T, e *env) {
	dls, ok := e.store.(driver.DeadLetterStore)
	if !ok {
		t.Skip("store is not an driver.DeadLetterStore")
	}
	cfg := fastConfig()
	cfg.MaxAttempts = 1
	ob := e.outbox(t, cfg)
	var fail atomic.Bool
	fail.Store(true)
	attempts := make(chan outbox.Event, 4)
	ob.Handle("listener-12", func(_ context.Context, ev outbox.Event) error {
		attempts <- ev
		if fail.Load() {
			return errAlwaysFails
		}
		return nil
	}, typeA)

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, attempts, "the failing attempt")
	ctx := context.Background()
	var list []outbox.DeadLetter
	deadline := time.Now().Add(wait)
	for len(list) == 0 && time.Now().Before(deadline) { // the DEAD write follows the listener
		var err error
		if list, err = dls.ListDead(ctx, "", 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(list) != 1 || list[0].ID != id || list[0].Attempts != 1 || !strings.Contains(list[0].LastError, errAlwaysFails.Error()) {
		t.Fatalf("dead letters %+v", list)
	}
	fail.Store(false)
	if n, err := dls.Replay(ctx, []string{id, "no-such-id"}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v; want 1", n, err)
	}
	ev := recv(t, attempts, "the replayed delivery")
	if ev.ID != id || ev.Attempt != 1 {
		t.Fatalf("replayed %+v", ev)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
}

// Cleanup deletes delivered rows and never an undelivered one.
func testCleanup(t *testing.T, e *env) {
	cl, ok := e.store.(driver.Cleaner)
	if !ok {
		t.Skip("store is not an driver.Cleaner")
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	ob := e.outbox(t, cfg)
	rec := newRecorder(3)
	ob.Handle("listener-13", rec.listen, typeA)
	start(t, ob)
	for range 3 {
		e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	}
	rec.wait(t, wait)
	closeNow(t, ob)
	pending := e.outbox(t, outbox.Config{DisableHotPath: true})
	keep := e.publish(t, pending, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	n, err := cl.Cleanup(context.Background(), -time.Hour, 100, true)
	want := int64(3)
	if e.h.DeletesDelivered {
		want = 0 // gone at delivery
	}
	if err != nil || n != want {
		t.Fatalf("Cleanup = %d, %v; want %d", n, err, want)
	}
	e.wantStatus(t, keep, outbox.StatusNew)
	if s := e.stats(t); s.Done != 0 || s.New != 1 {
		t.Fatalf("after cleanup %+v", s)
	}
}

// Config.Retention makes the engine delete old DONE rows at Start, DEAD
// rows too with CleanupDead, and never a NEW one.
func testRetention(t *testing.T, e *env) {
	if _, ok := e.store.(driver.Cleaner); !ok {
		t.Skip("store is not an driver.Cleaner")
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	ob := e.outbox(t, cfg)
	rec := newRecorder(3)
	ob.Handle("listener-14", rec.listen, typeA)
	ob.Handle("listener-15", func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("no")) }, typeB)
	start(t, ob)
	var done []string
	for range 2 {
		done = append(done, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)}))
	}
	dead := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	done = append(done, e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)}))
	rec.wait(t, wait)
	closeNow(t, ob)
	e.wantStatus(t, dead, outbox.StatusDead)
	pending := e.outbox(t, outbox.Config{DisableHotPath: true})
	keep := e.publish(t, pending, outbox.Envelope{Type: typeA, JSON: []byte(payload)})

	clean := func(cleanupDead bool) {
		t.Helper()
		m := &counting{cleanedCh: make(chan int64, 10)}
		cfg := fastConfig()
		cfg.DisablePoller, cfg.DisableHotPath = true, true
		cfg.Metrics = m
		cfg.Retention = time.Millisecond // everything written before this point
		cfg.CleanupBatchSize = 2         // several batches
		cfg.CleanupDead = cleanupDead
		cleaner := e.outbox(t, cfg)
		start(t, cleaner)
		for n := int64(2); n == 2; { // a run ends with a batch that is not full
			n = recv(t, m.cleanedCh, "a cleanup batch")
		}
		closeNow(t, cleaner)
	}
	time.Sleep(5 * time.Millisecond) // let the rows age past the 1ms retention (no signal for elapsed time)
	clean(false)
	for _, id := range done {
		if _, err := e.store.(driver.Inspector).Inspect(context.Background(), id); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("DONE event %s after cleanup: %v; want it deleted", id, err)
		}
	}
	e.wantStatus(t, dead, outbox.StatusDead)
	e.wantStatus(t, keep, outbox.StatusNew)
	clean(true)
	if _, err := e.store.(driver.Inspector).Inspect(context.Background(), dead); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("DEAD event after a cleanup with CleanupDead: %v; want it deleted", err)
	}
	e.wantStatus(t, keep, outbox.StatusNew)
}

// PublishAll writes several events in one call (through BatchInserter when
// the store has it, in chunks), all or none: an invalid envelope anywhere
// writes nothing and the error names its index; after commit every event
// is delivered once, with exactly its bytes.
func testPublishAll(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.HotQueueSize = 2000
	ob := e.outbox(t, cfg)
	ctx := context.Background()

	// All or none.
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ob.PublishAllTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}, outbox.Envelope{Type: typeA})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "JSON" || !strings.Contains(err.Error(), "envelope 1 of 2") {
		t.Fatalf("PublishAllTx with an invalid second envelope: %v; want a ValidationError naming envelope 1", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := e.stats(t); s.New+s.Done+s.Retry+s.Dead != 0 {
		t.Fatalf("rows after a rejected PublishAll: %+v; want none", s)
	}
	if _, err := ob.PublishAll(ctx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("PublishAll without a transaction: %v; want ErrNoTx", err)
	}

	// 1,200 events (more than one INSERT), one of them 1 MiB of bytes.
	const n = 1200
	envs := make([]outbox.Envelope, n)
	for i := range envs {
		envs[i] = outbox.Envelope{Type: typeA, AggregateID: fmt.Sprint(i), JSON: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: map[string]string{"n": fmt.Sprint(i)}}
	}
	big := make([]byte, outbox.MaxPayloadBytes)
	for i := range big {
		big[i] = byte(i * 7)
	}
	envs[600] = outbox.Envelope{Type: typeA, AggregateID: "600", Bytes: big}
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	start(t, ob)
	tx, err = e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ob.PublishAll(outbox.ContextWithTx(ctx, tx), envs...)
	if err != nil {
		tx.Rollback()
		t.Fatalf("PublishAll: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d ids for %d events", len(ids), n)
	}
	rec.wait(t, wait)
	closeNow(t, ob)
	counts, events := rec.snapshot()
	byID := map[string]outbox.Event{}
	for _, ev := range events {
		byID[ev.ID] = ev
	}
	for i, id := range ids {
		ev := byID[id]
		if counts[id] != 1 || ev.AggregateID != fmt.Sprint(i) {
			t.Fatalf("event %d (%s): delivered %d times, aggregate %q", i, id, counts[id], ev.AggregateID)
		}
		if i == 600 {
			if !bytes.Equal(ev.Bytes, big) {
				t.Fatal("the 1 MiB payload was not delivered byte for byte")
			}
		} else if string(ev.JSON) != fmt.Sprintf(`{"n":%d}`, i) || ev.Headers["n"] != fmt.Sprint(i) {
			t.Fatalf("event %d: payload %s headers %v", i, ev.JSON, ev.Headers)
		}
	}
	e.wantDelivered(t, int64(n))
}
