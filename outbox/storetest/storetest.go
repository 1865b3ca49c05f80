// Package storetest is the conformance suite for driver.Store
// implementations: one call runs the engine's acceptance tests (the
// specification's 18.1–18.6 and the multi-instance guarantees) against a
// real database.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) { ... },
//			ConcurrentWriters: true,
//		})
//	}
//
// Every subtest gets a fresh store (a new table), so subtests are
// independent. Stores must also implement driver.Inspector and
// driver.StatsReader; the tests of the other optional capabilities run
// only for stores that have them.
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
)

// Tx is a transaction the suite can publish through and end.
type Tx interface {
	outbox.TxContext
	Commit() error
	Rollback() error
}

// Beginner starts a transaction on the store's database.
type Beginner func(ctx context.Context) (Tx, error)

// Harness describes the store under test.
type Harness struct {
	// NewStore returns a store on a fresh, empty, migrated table, and a way
	// to begin transactions on the same database. Required.
	NewStore func(t *testing.T) (driver.Store, Beginner)
	// ConcurrentWriters reports whether two write transactions can be open
	// at once (false for SQLite, whose writers queue).
	ConcurrentWriters bool
	// DeletesDelivered reports a store that deletes an event once every
	// subscription has it (sqlstore's Options.DeleteDelivered): the suite
	// then takes an event Inspect no longer finds for a delivered one.
	DeletesDelivered bool
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"Atomicity", testAtomicity},
		{"CommitHotPath", testCommitHotPath},
		{"HotQueueFullDowngradesToPoller", testHotQueueFull},
		{"RetryThenDead", testRetryThenDead},
		{"TypedEventAndAggregate", testTyped},
		{"PublishWithoutTxFailsFast", testNoTx},
		{"InvalidEnvelopeWritesNothing", testInvalid},
		{"PanickingAndFailingListenersGoDead", testPanicAndFailing},
		{"PermanentErrorIsDeadAtOnce", testPermanent},
		{"ListenerIgnoringContextIsCut", testListenerTimeout},
		{"CloseDrainsQueues", testCloseDrains},
		{"LateCommitLeftToPoller", testLateCommitLeftToPoller},
		{"CloseHandsBackWhenCancelled", testCloseHandsBack},
		{"CloseReportsStuckListener", testCloseReportsStuckListener},
		{"StartCloseStress", testStartCloseStress},
		{"FourInstancesDeliverEachEventOnce", testFourInstances},
		{"PollerDoesNotStealFromHotPath", testNoSteal},
		{"ZombieWriteChangesNothing", testZombie},
		{"DeadInstanceEventsAreTakenOver", testTakeover},
		{"LateCommitIsDelivered", testLateCommit},
		{"PayloadRoundTripsByteExact", testPayloadRoundTrip},
		{"UndecodableRowGoesDead", testUndecodable},
		{"SentinelNeverLogged", testSentinel},
		{"DeadLettersReplay", testReplay},
		{"CleanupKeepsUndelivered", testCleanup},
		{"RetentionCleanup", testRetention},
		{"PublishAll", testPublishAll},
		{"NeverCompletesWithoutListener", testNeverCompletesWithoutListener},
		{"PublishOnlyInstanceClaimsNothing", testPublishOnlyInstanceClaimsNothing},
		{"CloseDuringClaimStrandsNothing", testCloseDuringClaim},
		{"CloseAfterALateClaim/Events", testCloseAfterALateClaim},
		{"CloseAfterALateClaim/Deliveries", testCloseAfterALateDeliveryClaim},
		{"CommitAfterCloseIsHandedBack", testCommitAfterClose},
		{"UnstorableErrorTextStillCounts", testUnstorableErrorText},
		{"ReclaimWhileFinishing", testReclaimWhileFinishing},
		{"LargestHeaders", testLargestHeaders},
		{"RetryRunsOnTime", testRetryRunsOnTime},
		{"SubscriptionsFailAlone", testSubscriptionsFailAlone},
		{"SubscriptionOwedElsewhere", testSubscriptionOwedElsewhere},
		{"PauseResume", testPauseResume},
		{"UnavailableCostsNoAttempts", testUnavailableCostsNoAttempts},
		{"BatchSubscription", testBatchSubscription},
		{"DeadLettersPerSubscription", testDeadPerSubscription},
		{"SubscribeValidation", testSubscribeValidation},
		{"LagAndDeadFilters", testLagAndDeadFilters},
		{"DeliverOneAndDrain", testDeliverOneAndDrain},
		{"Method/Subscriptions", testMethodSubscriptions},
		{"Method/Split", testMethodSplit},
		{"Method/RegistryFence", testMethodRegistryFence},
		{"Method/ClaimDeliveries", testMethodClaimDeliveries},
		{"Method/DeliveryWrites", testMethodDeliveryWrites},
		{"Method/DueNow", testMethodDueNow},
		{"Method/ReleaseOwner", testMethodReleaseOwner},
		{"Method/ClaimTypes", testMethodClaimTypes},
		{"Method/Retire", testMethodRetire},
		{"Ordered/Numbering", testOrderNumbering},
		{"Ordered/HeadLeasedToOwner", testOrderHeadLeasedToOwner},
		{"Ordered/LeasedAfterOwnersEvent", testOrderLeasedAfterOwnersEvent},
		{"Ordered/MarkDoneKeysLater", testOrderMarkDoneKeysLater},
		{"Ordered/ClaimHeads", testOrderClaimHeads},
		{"Ordered/SplitHolds", testOrderSplitHolds},
		{"Ordered/DeadBlocks", testOrderDeadBlocks},
		{"Ordered/DeliveriesInTurn", testOrderDeliveriesInTurn},
		{"Ordered/ReplayDeadHead", testOrderReplayDeadHead},
		{"Ordered/DueKeys", testOrderDueKeys},
		{"Ordered/BlockedKeys", testOrderBlockedKeys},
		{"Ordered/Known/ReplayWhileLaterLeased", testOrderReplayWhileLaterLeased},
		{"Ordered/Known/BlockedKeysFullPage", testOrderBlockedKeysFullPage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, begin := h.NewStore(t)
			for _, need := range []struct {
				ok   bool
				what string
			}{{is[driver.Inspector](st), "driver.Inspector"}, {is[driver.StatsReader](st), "driver.StatsReader"}} {
				if !need.ok {
					t.Fatalf("storetest: the store must implement %s", need.what)
				}
			}
			tc.fn(t, &env{h: h, store: st, begin: begin, logs: &syncBuffer{}})
		})
	}
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

// env is one subtest's world: a store, a way to begin transactions, and
// a log buffer every outbox of the subtest writes to.
type env struct {
	h     Harness
	store driver.Store
	begin Beginner
	logs  *syncBuffer
}

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
	id, err := ob.Publish(outbox.ContextWithTx(ctx, tx), ev)
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
