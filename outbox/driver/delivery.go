package driver

import (
	"context"
	"errors"
	"slices"
	"time"
)

// StatusSplit is the status of an event whose subscriptions did not all
// succeed at its first delivery: its delivery state is kept per
// subscription from then on (a Delivery for each subscription that still
// owes it, or gave up), and the event becomes DONE when the last of them
// is done.
const StatusSplit Status = 4

// SubscriptionInfo is what an instance registers about one of its
// subscriptions.
type SubscriptionInfo struct {
	Name string
	// Types are the event types it takes; nil: every type.
	Types []string
	// Order is 0 for an unordered subscription, 1 for an ordered one
	// whose dead events block their key, 2 for an ordered one whose dead
	// events are passed over (outbox.Order).
	Order int8
}

// SubscriptionState is a subscription as the database knows it: from
// every instance that registered it.
type SubscriptionState struct {
	SubscriptionInfo
	// Paused subscriptions take no events on any instance; their events
	// wait, attempts unchanged.
	Paused bool
	// Idle is the time since an instance last registered it, on the
	// database's clock.
	Idle time.Duration
}

// Registration is what DeliveryStore.SyncSubscriptions returns: every
// subscription the database knows, and the version of that registry.
type Registration struct {
	// Version is the registry's version: it changes whenever a
	// subscription is recorded that was not known before, or one's types
	// are widened. The engine passes the version of the registry it
	// decided an event's subscriptions by to the writes that complete the
	// event (Store.MarkDone, OrderedStore.MarkDoneKeys,
	// DeliveryStore.Split), which change nothing if it is no longer the
	// store's (ErrRegistryChanged).
	Version int64
	// Subscriptions are the subscriptions the database knows, in name
	// order.
	Subscriptions []SubscriptionState
}

// Widens reports whether a subscription registered with the types next
// takes a type that it did not with the types prev (nil: every type):
// then DeliveryStore.SyncSubscriptions changes the registry's version.
func Widens(prev, next []string) bool {
	if len(prev) == 0 {
		return false
	}
	if len(next) == 0 {
		return true
	}
	for _, t := range next {
		if !slices.Contains(prev, t) {
			return true
		}
	}
	return false
}

// DeliveryID names the delivery of one event to one subscription.
type DeliveryID struct {
	EventID      string
	Subscription string
}

// DeliveryWrite is the state of one subscription's delivery of an event,
// as the engine records it when the subscriptions of an event did not all
// succeed.
type DeliveryWrite struct {
	Subscription string
	// Status is StatusNew (due, no attempt failed: the subscription was
	// paused, its destination unavailable, or it belongs to another
	// instance), StatusRetry or StatusDead.
	Status Status
	// Attempts is the number of failed attempts so far.
	Attempts int
	// Delay is how long from now (on the database's clock) it is due.
	Delay time.Duration
	// Error is the last error, storable on every database, or "".
	Error string
}

// Delivery is the delivery of an event to one subscription, as claimed
// from the store: the event's row, with Status and Attempts those of the
// delivery.
type Delivery struct {
	Row
	Subscription string
}

// EventSplit is one event's part of DeliveryStore.Split: the deliveries to
// write for the subscriptions that did not deliver it.
type EventSplit struct {
	EventID string
	Writes  []DeliveryWrite
}

// DeliveryStore keeps the delivery state of each subscription. The engine
// needs it from every store: New fails without it.
//
// The common case costs nothing here: an event that every subscription
// delivered at the first try is completed with Store.MarkDone alone. Only
// when some did not does the engine call Split, and from then on the
// event's remaining deliveries are claimed, completed, retried and buried
// one subscription at a time. Like the Store's writes, every write after a
// claim changes a delivery only while owner still holds it.
type DeliveryStore interface {
	// SyncSubscriptions records subs as registered now (their types as
	// given) and returns every subscription the database knows, with its
	// state, and the registry's version. Recording a subscription the
	// database did not know, or widening the types of one it knew (a
	// change that can make an event owed to one more subscription),
	// increments the version in the same transaction; removals and
	// narrowings need not. The version returned is never newer than the
	// subscriptions returned: read it first.
	SyncSubscriptions(ctx context.Context, subs []SubscriptionInfo) (Registration, error)

	// SetPaused pauses or resumes a subscription for every instance. It
	// reports whether the subscription is known.
	SetPaused(ctx context.Context, name string, paused bool) (bool, error)

	// Split records, in one transaction, for each of splits whose event
	// owner still holds, a delivery for each of its writes, and sets the
	// event to StatusSplit, releasing owner's lease. held[i] reports
	// whether it did for splits[i]; an event owner no longer holds is left
	// as it is, and does not stop the others. The deliveries are free for
	// any instance when due. Like Store.MarkDone it completes each event
	// for a set of subscriptions (the writes' and those that delivered
	// it), and is fenced the same way: if the registry's version is not
	// registry, it changes nothing and returns an error wrapping
	// ErrRegistryChanged. The engine splits one event at a time when a
	// delivery failed, and many at once when destinations only deferred
	// them (a rate limit, an open circuit).
	Split(ctx context.Context, owner string, splits []EventSplit, registry int64) (held []bool, err error)

	// ClaimDeliveries is Claim for the deliveries of the given
	// subscriptions that are NEW or RETRY and due: it leases them to
	// req.Owner and returns them with their events' rows. A delivery to a
	// subscription f orders (OrderedStore), of an event numbered in its
	// key, is claimed only once no earlier event of the key is pending for
	// that subscription (OrderFilter), and while no other event of the key
	// is in flight to it (leased as a whole, or its delivery to the
	// subscription leased): one at a time, in order.
	//
	// With req.Run > 0 it may also lease, behind such a delivery (a head),
	// the deliveries to the same subscription of the events that follow
	// its event in the key, numbered one after another, each split with
	// that delivery NEW or RETRY, due and free (req.Run over the heads: a
	// run that the caller delivers in order, each once the one before it
	// succeeded). A run never has a gap and stops at the first event of
	// the key that is anything else.
	ClaimDeliveries(ctx context.Context, req ClaimRequest, subs []string, f OrderFilter) ([]Delivery, error)

	// CompleteDeliveries marks the deliveries owner holds among keys DONE,
	// and each of their events DONE once none of its deliveries is left
	// undone. It returns how many deliveries changed.
	CompleteDeliveries(ctx context.Context, owner string, keys []DeliveryID) (int, error)

	// FailDelivery records the outcome w (StatusNew: deferred without an
	// attempt; StatusRetry; StatusDead) of a delivery owner holds,
	// releasing the lease, and reports whether owner held it.
	FailDelivery(ctx context.Context, owner string, key DeliveryID, w DeliveryWrite) (bool, error)

	// ExtendDeliveryLeases is ExtendLeases for deliveries.
	ExtendDeliveryLeases(ctx context.Context, owner string, keys []DeliveryID, lease time.Duration) (int, error)

	// ReleaseDeliveries is Release for deliveries.
	ReleaseDeliveries(ctx context.Context, owner string, keys []DeliveryID, delay time.Duration) error

	// DueNow makes the deliveries of subscription sub that wait without a
	// lease (NEW, due later: deferred while its destination was down) due
	// at once, and returns how many. The engine calls it when the
	// subscription's circuit closes.
	DueNow(ctx context.Context, sub string) (int, error)
}

// Lag is what one subscription has not delivered yet: events it has not
// taken (and deliveries it owes), by state, and the age of the oldest.
type Lag struct {
	Subscription string
	// Pending counts the events due or waiting for it: new events of its
	// types and its NEW deliveries (paused, deferred, owed).
	Pending int64
	// Retrying counts its deliveries waiting for another attempt.
	Retrying int64
	// Dead counts its dead deliveries.
	Dead int64
	// Oldest is the age of the oldest pending or retrying event, on the
	// database's clock; 0 if none.
	Oldest time.Duration
	// BlockedKeys counts the ordering keys blocked for it (OrderedStore
	// BlockedKeys; an event dead as a whole counts for every blocking
	// subscription), up to MaxCountedBlockedKeys keys in all. The engine
	// fills it in (outbox.Outbox.Lag): stores leave it 0.
	BlockedKeys int64
	// Unregistered is set for a subscription that no instance registers
	// (retired, or unknown to the registry) but that still holds
	// deliveries: nothing delivers them. Outbox.Retire settles them.
	// OperatorStore.Lag returns one for each such subscription, after the
	// ones it was asked for.
	Unregistered bool
}

// Retired is what Retirer.RetireSubscription did.
type Retired struct {
	// Registered says the subscription was in the registry (and is not
	// any more).
	Registered bool
	// Dropped counts the deliveries it owed (NEW or RETRY) that were
	// deleted. Its DEAD deliveries stay, as dead letters.
	Dropped int64
	// Completed counts the events that became DONE because the dropped
	// deliveries were the last they waited for.
	Completed int64
}

// ErrSubscriptionLive is returned (wrapped) by
// Retirer.RetireSubscription for a subscription that an instance
// registered too recently: it is still running somewhere.
var ErrSubscriptionLive = errors.New("outbox: the subscription is still registered by a running instance")

// Retirer is implemented by stores that can retire a subscription.
type Retirer interface {
	// RetireSubscription retires subscription name, in one transaction:
	// unless an instance registered it less than idle ago (on the
	// database's clock; then it changes nothing and returns an error
	// wrapping ErrSubscriptionLive), it removes the subscription from the
	// registry and changes the registry's version (a completing write
	// decided with the subscription still owed is refused, like one
	// decided without a new one), deletes its NEW and RETRY deliveries,
	// and sets DONE every split event left with nothing undone. A name the
	// registry does not know still has its deliveries settled.
	RetireSubscription(ctx context.Context, name string, idle time.Duration) (Retired, error)
}

// MaxCountedBlockedKeys bounds the blocked keys Lag counts: past it,
// page through them with BlockedKeys.
const MaxCountedBlockedKeys = 100

// DeadFilter selects dead letters. Zero fields select everything.
type DeadFilter struct {
	// Subscription selects the dead deliveries of one subscription ("":
	// every subscription and the events dead as a whole).
	Subscription string
	// Type selects one event type.
	Type string
	// Since and Until bound the events' creation time (database clock).
	Since, Until time.Time
	// ErrorContains selects dead letters whose last error contains it.
	ErrorContains string
	// IDs selects these events only (at most 1000).
	IDs []string
	// After is the paging cursor: only events with a greater id.
	After string
	// Limit is the most dead letters returned; 0: 100.
	Limit int
}

// OperatorStore is implemented by stores that serve the operations
// surface: lag per subscription, and dead letters by filter.
type OperatorStore interface {
	// Lag returns the lag of each given subscription, then that of each
	// other subscription that holds deliveries (Lag.Unregistered).
	Lag(ctx context.Context, subs []SubscriptionInfo) ([]Lag, error)
	// FindDead returns the dead letters f selects, in id order (the
	// dead deliveries of one event together), without payloads.
	FindDead(ctx context.Context, f DeadFilter) ([]DeadLetter, error)
	// ReplayDead makes the dead letters f selects due again with zero
	// attempts, in their original publish order, and returns how many;
	// with dryRun it changes nothing and returns how many it would. A
	// replay of a subscription's dead delivery never re-runs the other
	// subscriptions; replaying again while the first replay is pending
	// changes nothing.
	ReplayDead(ctx context.Context, f DeadFilter, dryRun bool) (int, error)
}

// TxDeliveryStore is implemented by stores that run transactional
// subscriptions (Subscription.Tx).
type TxDeliveryStore interface {
	// DeliverInTx delivers the event eventID to subscription sub exactly
	// once: in one transaction on the store's database it runs f and
	// records the delivery as DONE (and the event DONE if that was its
	// last delivery left). If the delivery was recorded already (by this
	// instance before a crash, or by another that took the event over), it
	// does not call f, or rolls back what f did, and reports already. An
	// error of f rolls everything back and is returned as is, unless the
	// database gave up on the transaction (a deadlock, a serialization
	// failure: f's own statement or the record's): the store should then
	// run the transaction again from the start, f included, a few times,
	// since the engine counts a returned error as a failed attempt.
	//
	// The call is owner's turn with the delivery, as at: on the whole event
	// (at.Whole: sub has no delivery row yet), or on sub's delivery leased
	// to owner after at.Attempts failed attempts. If that turn is over when
	// the delivery is to be recorded (the event was split since, or the
	// delivery is no longer leased to owner with those attempts: a call
	// that outlived its lease or its timeout, whose outcome the engine has
	// written meanwhile), it records nothing, rolls back what f did, and
	// returns ErrLeaseLost.
	DeliverInTx(ctx context.Context, owner string, at TxTurn, eventID, sub string, f func(tx DBTx) error) (already bool, err error)
}

// TxTurn is the turn a DeliverInTx call is made in: see DeliverInTx.
type TxTurn struct {
	Whole    bool // on the whole event; else on the subscription's delivery
	Attempts int  // the delivery's failed attempts when it was leased
}

// ErrLeaseLost is DeliverInTx's answer when the caller's turn with the
// delivery is over: nothing was recorded, and f's effects were rolled back.
var ErrLeaseLost = errors.New("outbox: the delivery is no longer this caller's (its lease or its turn ended): not recorded")
