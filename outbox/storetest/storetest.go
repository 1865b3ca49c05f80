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
// independent; most run in parallel unless Harness.Serial is set. The
// subtests are named Method/<method>/<case> for the cases that call one
// store method, or a group of related methods, directly (each group in
// its file method_<name>.go), and Engine/<case> for those that drive an
// outbox.Outbox over the store (engine_<topic>.go). Stores must also
// implement driver.Inspector and driver.StatsReader; the tests of the
// other optional capabilities run only for stores that have them.
package storetest

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Tx is a transaction the suite can publish through and end.
type Tx interface {
	txctx.Tx
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
	// ArchivesDelivered reports a store that moves a delivered event into
	// an archive (sqlstore's Options.ArchiveDelivered; set
	// DeletesDelivered too): Inspect finds it there (Record.Archived),
	// and Config.Retention's cleanup leaves it to the archive's own.
	ArchivesDelivered bool
	// Serial runs every case alone, one after another. By default most
	// cases run in parallel (see Run), each on a store of its own, so
	// NewStore is called from several goroutines at once: set Serial if
	// it is not safe for that, or if the stores it returns cannot be
	// used at once (one database file or schema shared by every case, a
	// server that allows too few connections for several cases' pools).
	Serial bool
	// IgnoresHints reports a store that ignores the engine's hints:
	// driver.Row.KeyAfter (it leases heads only), driver.ClaimRequest.Run
	// (it claims heads only) and MarkDoneKeys' exact later keys (it
	// reports every key). The engine is correct on such a store, only
	// slower; the cases that check the hints are skipped.
	IgnoresHints bool
	// RefusesOnce reports a store that implements driver.OnceInserter but
	// refuses it on this table (sqlstore on a partitioned MySQL table):
	// the case checks that it says so and writes nothing.
	RefusesOnce bool
}

// Run runs the suite. The cases are subtests named Method/<method>/<case>
// for those that call one store method (or a group of related methods)
// directly, and Engine/<case> for those that drive an outbox.Outbox over
// the store. Unless h.Serial is set, every case but those listed alone in
// cases calls t.Parallel: they run concurrently, up to go test's
// -parallel, each on the store NewStore returns for it, once the alone
// ones have run one at a time.
func Run(t *testing.T, h Harness) {
	for _, tc := range cases() {
		t.Run(tc.name, func(t *testing.T) {
			if tc.hint && h.IgnoresHints {
				t.Skip("storetest: the store ignores the engine's hints (Harness.IgnoresHints)")
			}
			if !h.Serial && !tc.alone {
				t.Parallel()
			}
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

// testCase is one subtest of Run. An alone case never runs beside
// another: it holds leases of a few hundred milliseconds that must not
// run out before its next step, or it asserts an upper bound on elapsed
// time, and other cases running at once on a loaded machine could make
// it fail for no fault of the store.
type testCase struct {
	name  string
	fn    func(*testing.T, *env)
	alone bool
	hint  bool // checks a hint a store may ignore (Harness.IgnoresHints)
}

// cases lists the suite, method by method, then the engine's behaviour.
func cases() []testCase {
	return []testCase{
		// driver.Store
		{name: "Method/Claim/Types", fn: testMethodClaimTypes},
		{name: "Method/EventWrites/ZombieWriteChangesNothing", fn: testZombie, alone: true}, // a 1 s lease must outlast the next claim
		// driver.OnceInserter
		{name: "Method/InsertOnce/Duplicate", fn: testMethodInsertOnce},
		// driver.Scheduler
		{name: "Method/Schedule/ScheduledAndCancel", fn: testMethodSchedule},
		// driver.DeliveryStore
		{name: "Method/SyncSubscriptions/SetPaused", fn: testMethodSubscriptions},
		{name: "Method/SyncSubscriptions/RegistryFence", fn: testMethodRegistryFence},
		{name: "Method/Split/OwnerOnly", fn: testMethodSplit},
		{name: "Method/Split/Many", fn: testMethodSplitMany},
		{name: "Method/ClaimDeliveries/OneOwnerEach", fn: testMethodClaimDeliveries, alone: true}, // 250 ms leases must outlast the claims
		{name: "Method/ClaimDeliveries/InTurn", fn: testOrderDeliveriesInTurn},
		{name: "Method/DeliveryWrites/OwnerOnly", fn: testMethodDeliveryWrites, alone: true}, // a claim within 200 ms of a release
		{name: "Method/DueNow/OneSubscription", fn: testMethodDueNow},
		// driver.OwnerReleaser, driver.Retirer
		{name: "Method/ReleaseOwner/OwnersLeasesOnly", fn: testMethodReleaseOwner},
		{name: "Method/RetireSubscription/DropsOwed", fn: testMethodRetire},
		// driver.OrderedStore
		{name: "Method/InsertOrdered/Numbering", fn: testOrderNumbering},
		{name: "Method/InsertOrdered/HeadLeasedToOwner", fn: testOrderHeadLeasedToOwner},
		{name: "Method/InsertOrdered/LeasedAfterOwnersEvent", fn: testOrderLeasedAfterOwnersEvent, hint: true},
		{name: "Method/MarkDoneKeys/Later", fn: testOrderMarkDoneKeysLater, hint: true},
		{name: "Method/ClaimHeads/HeadOnly", fn: testOrderClaimHeads},
		{name: "Method/ClaimHeads/SplitHolds", fn: testOrderSplitHolds},
		{name: "Method/ClaimHeads/AllBehind", fn: testOrderAllBehind},
		{name: "Method/ClaimHeads/ReplayDeadHead", fn: testOrderReplayDeadHead},
		{name: "Method/ClaimHeads/ReplayWhileLaterLeased", fn: testOrderReplayWhileLaterLeased},
		{name: "Method/BlockedKeys/DeadBlocks", fn: testOrderDeadBlocks},
		{name: "Method/BlockedKeys/Paging", fn: testOrderBlockedKeys},
		{name: "Method/BlockedKeys/FullPage", fn: testOrderBlockedKeysFullPage},
		{name: "Method/DueKeys/Paging", fn: testOrderDueKeys},
		// driver.DeadLetterStore, driver.Cleaner
		{name: "Method/DeadLetters/Replay", fn: testReplay},
		{name: "Method/DeadLetters/PerSubscription", fn: testDeadPerSubscription},
		{name: "Method/Cleanup/KeepsUndelivered", fn: testCleanup},

		// Publishing.
		{name: "Engine/Atomicity", fn: testAtomicity},
		{name: "Engine/TypedEventAndAggregate", fn: testTyped},
		{name: "Engine/PublishWithoutTxFailsFast", fn: testNoTx},
		{name: "Engine/InvalidEnvelopeWritesNothing", fn: testInvalid},
		{name: "Engine/PayloadRoundTripsByteExact", fn: testPayloadRoundTrip},
		{name: "Engine/LargestHeaders", fn: testLargestHeaders},
		{name: "Engine/PublishAll", fn: testPublishAll},
		// The hot path and the poller.
		{name: "Engine/CommitHotPath", fn: testCommitHotPath},
		{name: "Engine/HotQueueFullDowngradesToPoller", fn: testHotQueueFull},
		{name: "Engine/LateCommitLeftToPoller", fn: testLateCommitLeftToPoller, alone: true}, // 200 ms leases must outlast a delivery
		{name: "Engine/LateCommitIsDelivered", fn: testLateCommit},
		{name: "Engine/PollerDoesNotStealFromHotPath", fn: testNoSteal},
		// Failures, retries, dead events.
		{name: "Engine/RetryThenDead", fn: testRetryThenDead},
		{name: "Engine/PanickingAndFailingListenersGoDead", fn: testPanicAndFailing},
		{name: "Engine/PermanentErrorIsDeadAtOnce", fn: testPermanent},
		{name: "Engine/ListenerIgnoringContextIsCut", fn: testListenerTimeout},
		{name: "Engine/UndecodableRowGoesDead", fn: testUndecodable},
		{name: "Engine/UnstorableErrorTextStillCounts", fn: testUnstorableErrorText},
		{name: "Engine/ReclaimWhileFinishing", fn: testReclaimWhileFinishing},
		{name: "Engine/RetryRunsOnTime", fn: testRetryRunsOnTime, alone: true}, // the second attempt within 1 s
		{name: "Engine/SentinelNeverLogged", fn: testSentinel},
		// Start and Close.
		{name: "Engine/CloseDrainsQueues", fn: testCloseDrains},
		{name: "Engine/CloseHandsBackWhenCancelled", fn: testCloseHandsBack},
		{name: "Engine/CloseReportsStuckListener", fn: testCloseReportsStuckListener},
		{name: "Engine/StartCloseStress", fn: testStartCloseStress},
		{name: "Engine/CloseDuringClaimStrandsNothing", fn: testCloseDuringClaim},
		{name: "Engine/CloseAfterALateClaim/Events", fn: testCloseAfterALateClaim},
		{name: "Engine/CloseAfterALateClaim/Deliveries", fn: testCloseAfterALateDeliveryClaim},
		{name: "Engine/CommitAfterCloseIsHandedBack", fn: testCommitAfterClose, alone: true}, // delivered within 5 s
		// Several instances.
		{name: "Engine/FourInstancesDeliverEachEventOnce", fn: testFourInstances},
		{name: "Engine/DeadInstanceEventsAreTakenOver", fn: testTakeover},
		{name: "Engine/NeverCompletesWithoutListener", fn: testNeverCompletesWithoutListener},
		{name: "Engine/PublishOnlyInstanceClaimsNothing", fn: testPublishOnlyInstanceClaimsNothing},
		// Subscriptions.
		{name: "Engine/SubscriptionsFailAlone", fn: testSubscriptionsFailAlone},
		{name: "Engine/SubscriptionOwedElsewhere", fn: testSubscriptionOwedElsewhere},
		{name: "Engine/PauseResume", fn: testPauseResume},
		{name: "Engine/UnavailableCostsNoAttempts", fn: testUnavailableCostsNoAttempts},
		{name: "Engine/BatchSubscription", fn: testBatchSubscription},
		{name: "Engine/SubscribeValidation", fn: testSubscribeValidation},
		// The operator's API and retention.
		{name: "Engine/DeliverOneAndDrain", fn: testDeliverOneAndDrain},
		{name: "Engine/LagAndDeadFilters", fn: testLagAndDeadFilters},
		{name: "Engine/LagAgesFromPublication", fn: testLagAgesFromPublication},
		{name: "Engine/RetentionCleanup", fn: testRetention},
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
