package driver

import (
	"context"
	"slices"
	"time"
)

// OrderFilter names the ordered subscriptions, which decide when an event
// of a key is still pending and so holds back the key's later events.
//
// Head-of-line is per key and subscription. An event is pending for an
// ordered subscription S while it is NEW or RETRY as a whole; DEAD as a
// whole if S is in Block; or split with a delivery to S that is NEW or
// RETRY, or DEAD if S is in Block. An event is pending (for ordering)
// while it is pending for any of them: until then its key's done_seq does
// not pass it, and no later event of the key goes out on the hot path.
// The later events still go to every subscription that owes nothing
// earlier (ClaimHeads, Row.Behind), and to S as soon as S delivered the
// earlier ones (ClaimDeliveries).
type OrderFilter struct {
	// Block are the ordered subscriptions whose dead deliveries hold their
	// key until they are replayed or skipped.
	Block []string
	// Skip are the ordered subscriptions whose dead deliveries hold
	// nothing back.
	Skip []string
	// Every says that Block and Skip are every subscription, here and on
	// the other instances: none is unordered. A head whose Behind would
	// name them all then holds back nobody who is not behind on its key
	// already, and ClaimHeads leaves it, and its run, to a later claim
	// (once some subscription caught up): leased, it would only be
	// recorded as deferred for all of them, a write per event, and drain
	// later as deliveries (AllBehind; storetest's ClaimHeads/AllBehind).
	Every bool
}

// Empty reports whether f names no subscription.
func (f OrderFilter) Empty() bool { return len(f.Block) == 0 && len(f.Skip) == 0 }

// Ordered reports whether f names subscription sub.
func (f OrderFilter) Ordered(sub string) bool {
	return slices.Contains(f.Block, sub) || slices.Contains(f.Skip, sub)
}

// Blocks reports whether sub is in f.Block: its dead events hold its key.
func (f OrderFilter) Blocks(sub string) bool { return slices.Contains(f.Block, sub) }

// AllBehind reports whether a head whose Row.Behind is behind may be left
// unleased (OrderFilter.Every): every subscription is behind on its key.
func (f OrderFilter) AllBehind(behind []string) bool {
	if !f.Every || f.Empty() || len(behind) < len(f.Block)+len(f.Skip) {
		return false
	}
	for _, n := range slices.Concat(f.Block, f.Skip) {
		if !slices.Contains(behind, n) {
			return false
		}
	}
	return true
}

// KeyDone names an ordered event whose outcome was just recorded.
type KeyDone struct {
	EventID string
	Key     string
	// Seq is its number in its key's sequence, or 0 if unknown.
	Seq int64
}

// BlockedKey is an ordering key whose earliest event pending for a
// blocking subscription (OrderFilter.Block) is dead for it: the key's
// later events wait for that subscription until an operator replays or
// skips the dead event. They still go to the other subscriptions.
type BlockedKey struct {
	Key string
	// Subscription is the blocked subscription; "" when the event is dead
	// as a whole (it could not be read), which blocks every one of Block.
	Subscription string
	// EventID and Type are the dead event's.
	EventID string
	Type    string
	// Waiting counts the key's later events held back for Subscription.
	Waiting int64
	// Since is when the dead event was written (database clock).
	Since time.Time
}

// OrderedStore is implemented by stores that deliver the events of one
// ordering key in order (Subscription.Order). Every event of a key gets a
// number in the key's sequence when it is written; at any time at most
// one event of a key is leased, and only the earliest one pending under
// the filter (its head).
type OrderedStore interface {
	// InsertOrdered writes row (whose OrderingKey is set) through exec, the
	// caller's transaction, numbered next in its key's sequence (setting
	// row.KeySeq where the database reports it). Doing so locks the key
	// until the transaction ends, so that transactions publishing one key
	// commit in sequence order.
	//
	// head reports that the key's previous event is known to be delivered
	// (KeysDone). If owner is set and the event is the head, or is
	// numbered row.KeyAfter+1 (row.KeyAfter > 0: the owner holds the
	// event before it), the row is written leased to owner for lease and
	// leased is true; else it is written free. A store that cannot tell
	// the number within the statement leases heads only. It must lock
	// nothing else: it runs in the application's transaction.
	InsertOrdered(ctx context.Context, exec Execer, row *Row, owner string, lease time.Duration, f OrderFilter) (head, leased bool, err error)

	// KeysDone records that each of evs that is no longer pending under f
	// (or no longer stored, then with its Seq) is delivered, and with it
	// every earlier event of its key, unless an earlier event of the key
	// is still pending under f (an event claimed while a subscription was
	// behind): the record then stops below the earliest one pending. The
	// next event of a key whose record reaches the one before it may go
	// out on the hot path. It is a hint, best effort: a key that a
	// transaction holds may be passed over, and it must never wait for
	// one.
	KeysDone(ctx context.Context, evs []KeyDone, f OrderFilter) error

	// MarkDoneKeys is Store.MarkDone and, in the same transaction, KeysDone
	// of evs (ordered events among ids, with their numbers) if every id
	// changed: one commit for both. The caller vouches that nothing earlier
	// of their keys is pending (the engine passes only events that went
	// out with nobody behind): the store need not look. The engine calls it instead of
	// MarkDone for a batch with ordered events: a wrapper of a store that
	// intercepts MarkDone must intercept it too. later are the keys of evs
	// whose next events may wait in the table: those with events numbered
	// after the ones recorded, those whose record was passed over (a
	// transaction holds the key), and all of them if not every id changed.
	// It is fenced by registry as MarkDone is: on ErrRegistryChanged it
	// changed nothing, keys included.
	MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []KeyDone, registry int64) (n int, later []string, err error)

	// ClaimHeads leases to req.Owner, for each of keys, its head if the
	// head is due and no other event of the key is held by a live lease as
	// a whole, and returns those rows: at most req.Limit heads (when more
	// keys have one to lease, which of them is the store's choice; the
	// engine passes keys in order and sqlstore takes the first). A key's
	// head here is its earliest event that is NEW or RETRY as a whole:
	// the events before it are delivered, dead, or split (their
	// deliveries claimed one subscription at a time). Each row's Behind names the subscriptions of f for which
	// an earlier event of the key is pending (see OrderFilter), or which
	// have a delivery of another event of the key under a live lease; a
	// store that cannot tell must not lease the row. A head is leased even
	// when every subscription that takes it is behind: the engine records
	// it as deferred for them, and the key goes on for the others.
	//
	// With req.Run > 0 it may also lease, behind a head, some of the
	// events that follow it in its key (req.Run over the heads it may
	// lease: req.Run/min(len(keys), req.Limit) a key), numbered one
	// after another (KeySeq head+1, head+2, …), each NEW or RETRY as a
	// whole, due and free: a run that the caller delivers in order,
	// each once the one before it succeeded (or, for the subscriptions of
	// Behind, was deferred), with no claim between them. Each event of a
	// run has its head's Behind: those subscriptions owe it the head too.
	// Rows come back grouped by key, each key's in KeySeq order, its head
	// first; a run never has a gap.
	ClaimHeads(ctx context.Context, req ClaimRequest, keys []string, f OrderFilter) ([]Row, error)

	// DueKeys returns up to limit ordering keys greater than after, in
	// order, that have NEW or RETRY events due and not held by a live
	// lease (their heads may still be pending elsewhere).
	DueKeys(ctx context.Context, after string, limit int) ([]string, error)

	// BlockedKeys returns up to limit keys greater than after, in order,
	// blocked for a subscription of f.Block (BlockedKey), each once: with
	// its earliest event that blocks one (of several blocked by it, the
	// first by name).
	BlockedKeys(ctx context.Context, f OrderFilter, after string, limit int) ([]BlockedKey, error)

	// SkipDead gives up on the dead events among ids for good: each DEAD
	// event, and each dead delivery of the given events, becomes DONE
	// (its last error kept), so that it no longer holds back its key. It
	// returns how many it changed.
	SkipDead(ctx context.Context, ids []string) (int, error)
}
