package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Helpers the cases share: the subtest's world (env), publishing
// and inspecting, a recording listener, counting metrics.

const (
	typeA   outbox.EventType = "A"
	typeB   outbox.EventType = "B"
	wait                     = 20 * time.Second
	payload                  = `{"order":"42"}`
)

// fastConfig returns a config that polls often, for tests.
func fastConfig() outbox.Config {
	return outbox.Config{
		PollInterval:    10 * time.Millisecond,
		PollMaxInterval: 50 * time.Millisecond,
		SkipRecent:      -1, // none: tests that poll by hand must see rows at once
		Retry:           outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond }),
	}
}

// outbox returns a new, not yet started outbox that logs into e.logs and
// is closed when t ends.
func (e *env) outbox(t *testing.T, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ob, err := outbox.New(e.store, cfg)
	if err != nil {
		t.Fatalf("outbox.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ob.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return ob
}

func start(t *testing.T, ob *outbox.Outbox) {
	t.Helper()
	if err := ob.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func closeNow(t *testing.T, ob *outbox.Outbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ob.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// publish publishes env in its own transaction and commits it.
func (e *env) publish(t *testing.T, ob *outbox.Outbox, ev outbox.Envelope) string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	id, err := ob.Publish(txctx.With(ctx, tx), ev)
	if err != nil {
		tx.Rollback()
		t.Fatalf("Publish: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return id
}

// publishMany publishes n events of type typ, per transactions of up to
// 500 events, and returns their ids.
func (e *env) publishMany(t *testing.T, ob *outbox.Outbox, typ outbox.EventType, n int) []string {
	t.Helper()
	ctx := context.Background()
	ids := make([]string, 0, n)
	for len(ids) < n {
		tx, err := e.begin(ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		for k := min(500, n-len(ids)); k > 0; k-- {
			id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: typ, JSON: []byte(fmt.Sprintf(`{"n":%d}`, len(ids)))})
			if err != nil {
				tx.Rollback()
				t.Fatalf("PublishTx: %v", err)
			}
			ids = append(ids, id)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	return ids
}

// insertRows commits n rows of type T leased to owner (or free).
func (e *env) insertRows(t *testing.T, n int, owner string, lease time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = outbox.NewID()
		r := driver.Row{ID: ids[i], Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, tx, &r, owner, lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// insertTyped writes one free row of each of types, in order, and returns
// their ids.
func (e *env) insertTyped(t *testing.T, types ...string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(types))
	for i, typ := range types {
		ids[i] = outbox.NewID()
		r := driver.Row{ID: ids[i], Type: typ, Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, tx, &r, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (e *env) ds() driver.DeliveryStore { return e.store.(driver.DeliveryStore) }

// registry returns the registry's version now, for a completing write
// (MarkDone, MarkDoneKeys, Split) that must not be refused for a stale
// registry.
func (e *env) registry(t testing.TB) int64 {
	t.Helper()
	reg, err := e.ds().SyncSubscriptions(context.Background(), nil)
	if err != nil {
		t.Fatalf("SyncSubscriptions: %v", err)
	}
	return reg.Version
}

func (e *env) inspect(t *testing.T, id string) outbox.Record {
	t.Helper()
	rec, err := e.store.(driver.Inspector).Inspect(context.Background(), id)
	if err != nil && e.h.DeletesDelivered && errors.Is(err, driver.ErrNotFound) {
		return outbox.Record{Row: driver.Row{ID: id, Status: outbox.StatusDone}}
	}
	if err != nil {
		t.Fatalf("Inspect %s: %v", id, err)
	}
	return rec
}

// wantDelivered checks that the table holds the n events of a subtest, all
// delivered: n DONE rows and nothing else, or, for a store that deletes
// delivered events, no row at all.
func (e *env) wantDelivered(t *testing.T, n int64) {
	t.Helper()
	s := e.stats(t)
	rows := s.New + s.Retry + s.Done + s.Dead + s.Split + s.Unknown
	if e.h.DeletesDelivered {
		if rows != 0 {
			t.Fatalf("stats %+v; want no row: the %d delivered events deleted", s, n)
		}
		return
	}
	if s.Done != n || rows != n {
		t.Fatalf("stats %+v; want exactly %d rows, all DONE", s, n)
	}
}

func (e *env) stats(t *testing.T) outbox.Stats {
	t.Helper()
	s, err := e.store.(driver.StatsReader).Stats(context.Background())
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return s
}

// wantStatus checks an event's status. A split event whose deliveries all
// have the wanted status counts as in that status, with the first
// delivery's attempts, owner and last error: the tests that use it have
// one subscription per event type.
func (e *env) wantStatus(t *testing.T, id string, want outbox.Status) outbox.Record {
	t.Helper()
	rec := e.inspect(t, id)
	if rec.Status == outbox.StatusSplit && want != outbox.StatusSplit && len(rec.Deliveries) > 0 {
		same := true
		for _, d := range rec.Deliveries {
			same = same && d.Status == want
		}
		if same {
			d := rec.Deliveries[0]
			rec.Status, rec.Attempts, rec.Owner, rec.LastError = want, d.Attempts, d.Owner, d.LastError
		}
	}
	if rec.Status != want {
		t.Fatalf("event %s: status %v, want %v (attempts %d, owner %q, last error %q)", id, rec.Status, want, rec.Attempts, rec.Owner, rec.LastError)
	}
	return rec
}

// recorder is a listener that records deliveries and signals when it has
// seen a given number of distinct events.
type recorder struct {
	mu     sync.Mutex
	counts map[string]int
	events []outbox.Event
	want   int
	done   chan struct{}
}

func newRecorder(want int) *recorder {
	return &recorder{counts: map[string]int{}, want: want, done: make(chan struct{})}
}

func (r *recorder) listen(_ context.Context, ev outbox.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[ev.ID]++
	r.events = append(r.events, ev)
	if len(r.counts) == r.want && r.counts[ev.ID] == 1 {
		// Once, even with duplicates to come (at least once: an event
		// whose DONE was refused for a stale registry goes again).
		close(r.done)
	}
	return nil
}

func (r *recorder) snapshot() (map[string]int, []outbox.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(map[string]int, len(r.counts))
	for k, v := range r.counts {
		c[k] = v
	}
	return c, append([]outbox.Event(nil), r.events...)
}

// wait blocks until the recorder has seen want events, or fails the test
// after timeout.
func (r *recorder) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		c, _ := r.snapshot()
		t.Fatalf("delivered %d distinct events within %v, want %d", len(c), timeout, r.want)
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func waitGroup(t *testing.T, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done, what)
}

// waitFor polls cond until it holds or the test's wait runs out; it is
// for conditions on the database, which has no signal to wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// callCounter counts handler calls per event id.
type callCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *callCounter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// counting counts the engine's metrics.
type counting struct {
	outbox.NopMetrics
	published, hotEnqueued, hotDropped, coldEnqueued, reclaimed atomic.Int64
	noListener                                                  atomic.Int64
	outcomes                                                    sync.Map   // outbox.Outcome -> *atomic.Int64
	cleanedCh                                                   chan int64 // each Cleaned call, if not nil
}

func (c *counting) Cleaned(n int64) {
	if c.cleanedCh != nil {
		c.cleanedCh <- n
	}
}

func (c *counting) Published(outbox.EventType)  { c.published.Add(1) }
func (c *counting) NoListener(outbox.EventType) { c.noListener.Add(1) }
func (c *counting) HotEnqueued()                { c.hotEnqueued.Add(1) }
func (c *counting) HotDropped()                 { c.hotDropped.Add(1) }
func (c *counting) ColdEnqueued(n int)          { c.coldEnqueued.Add(int64(n)) }
func (c *counting) LeasesReclaimed(n int)       { c.reclaimed.Add(int64(n)) }
func (c *counting) Dispatched(_ outbox.EventType, _ outbox.Path, o outbox.Outcome, _ time.Duration) {
	v, _ := c.outcomes.LoadOrStore(o, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}
func (c *counting) outcome(o outbox.Outcome) int64 {
	v, ok := c.outcomes.Load(o)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

var errAlwaysFails = errors.New("downstream unavailable")

func truncated(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
