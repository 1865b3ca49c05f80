package outbox

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// keyTable is what this instance knows of the ordering keys it delivers,
// so that the events of a busy key stay on the hot path:
//
//   - For each key with an event in this instance's hands, its chain: the
//     event being delivered and the events of the key behind it, leased
//     here when they were published or claimed with it (a run), in order.
//     When the one being delivered succeeds, the next goes to the hot
//     queue at once, with no trip through the table; when it fails, those
//     behind it are given back, to wait in the table behind it. When it
//     succeeds for every subscription but those its claim said were
//     behind on the key (Row.Behind), the next goes on only if it owes
//     them too. One ordered subscription's deliveries of a key's split
//     events chain the same way, under the key and the subscription
//     (chainKey).
//   - For recently seen keys, the highest number leased here (by Publish
//     or a claim) and the highest delivered here. Publish passes the
//     first to the store (Row.KeyAfter), which then leases the next
//     event of the key to this instance even though its predecessor is
//     not yet recorded as delivered; the commit decides with the chain
//     and the second whether it goes now, waits in the chain, or goes
//     back to the table.
//
// An event goes out from here only if the store said every earlier event
// of its key was delivered (the head), or the event numbered just before
// it was delivered here: it waited behind it in the chain, or came after
// it was. That rests on two facts: a key's committed numbers are never
// reused (a number is taken back only by a rollback, and key rows are
// never deleted), and an event passes its key on only once every
// subscription here has it (or, in a run, every one not behind). The chain holds only events leased to this
// instance, in the in-flight set, so that their leases are renewed while
// they wait; Close hands them back.
type keyTable struct {
	mu     sync.Mutex
	chains map[string]*keyChain
	// Two generations of recent keys: when recent reaches maxRecentKeys,
	// it becomes older and older is dropped. A key forgotten only costs
	// its next event a trip through the table.
	recent, older map[string]keySeen
	// space is signalled when a chain started by a claim ends: the
	// sequencer may claim another key (claimedKeys).
	space chan struct{}
}

// maxRecentKeys bounds the keys the table remembers (two generations of
// it at most).
const maxRecentKeys = 1 << 16

type keySeen struct {
	leased    int64 // highest number leased here
	delivered int64 // highest number delivered here
}

// chainKey names the chain of it: its key for an event delivered to
// every subscription here, its key and subscription for one delivery (a
// split event's, to an ordered subscription, claimed one subscription at a
// time: such deliveries of a key follow one another per subscription).
func chainKey(it *item) string {
	if it.sub == nil {
		return it.env.OrderingKey
	}
	return it.env.OrderingKey + "\x00" + it.sub.Name
}

// chained reports whether it goes through a chain: an ordered event with
// its number, as a whole or delivered to an ordered subscription.
func chained(it *item) bool {
	return it.env.ordered && it.env.seq > 0 && (it.sub == nil || it.sub.Order != Unordered)
}

// keyChain is a key's events in this instance's hands.
type keyChain struct {
	running int64     // the number of the event being delivered
	tail    int64     // the highest number in the chain
	waiting []*item   // committed behind running, in order
	moved   time.Time // when running began (the chain's last move)
	claimed bool      // started by a claim, not by a publish here
}

func newKeyTable() *keyTable {
	return &keyTable{chains: map[string]*keyChain{}, recent: map[string]keySeen{}, older: map[string]keySeen{}, space: make(chan struct{}, 1)}
}

// end removes the chain of key (t.mu held), and signals space if a claim
// had started it.
func (t *keyTable) end(key string) {
	c := t.chains[key]
	delete(t.chains, key)
	if c != nil && c.claimed {
		select {
		case t.space <- struct{}{}:
		default:
		}
	}
}

// claimedKeys returns how many chains claims started: the keys whose
// heads this instance claimed from the table and still has in hand.
func (t *keyTable) claimedKeys() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.chains {
		if c.claimed {
			n++
		}
	}
	return n
}

func (t *keyTable) seen(key string) keySeen {
	if s, ok := t.recent[key]; ok {
		return s
	}
	return t.older[key]
}

func (t *keyTable) note(key string, f func(*keySeen)) {
	s, ok := t.recent[key]
	if !ok {
		s = t.older[key]
		if len(t.recent) >= maxRecentKeys {
			t.older, t.recent = t.recent, make(map[string]keySeen, maxRecentKeys/4)
		}
	}
	f(&s)
	t.recent[key] = s
}

// after returns the number Publish passes as Row.KeyAfter for key: the
// highest number of it leased here.
func (t *keyTable) after(key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seen(key).leased
}

// keyAfter is Publish's read of the key table (the dispatcher's): the
// number of the last event of key leased here, for driver.Row.KeyAfter.
func (d *dispatcher) keyAfter(key string) int64 { return d.keys.after(key) }

// leasedAtInsert is Publish's one write to the key table: the event
// numbered seq of key was inserted leased to this instance.
func (d *dispatcher) leasedAtInsert(key string, seq int64) { d.keys.leased(key, seq) }

// leased records that the event numbered seq of key was leased here.
func (t *keyTable) leased(key string, seq int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.note(key, func(s *keySeen) { s.leased = max(s.leased, seq) })
}

// commitAction says what to do with an ordered event leased here whose
// transaction committed.
type commitAction int8

const (
	commitGo      commitAction = iota // deliver it now: it starts its key's chain
	commitWait                        // it waits in its key's chain
	commitRelease                     // give it back: what it follows is not known here
)

// committed decides for it, an ordered event leased to this instance
// whose transaction has committed; head says the store reported every
// earlier event of its key delivered.
func (t *keyTable) committed(it *item, head bool) commitAction {
	key, seq := chainKey(it), it.env.seq
	if seq <= 0 {
		// Its number is not known here (the store leases only heads
		// then): it goes on its own, outside any chain.
		if head {
			return commitGo
		}
		return commitRelease
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.chains[key]; c != nil {
		if c.tail == seq-1 {
			c.waiting = append(c.waiting, it)
			c.tail = seq
			return commitWait
		}
		return commitRelease
	}
	if head || t.seen(key).delivered == seq-1 {
		t.chains[key] = &keyChain{running: seq, tail: seq, moved: time.Now()}
		return commitGo
	}
	if it.sub == nil {
		t.forgetLeased(key)
	}
	return commitRelease
}

// claimed starts the chain of the key of it, an ordered event claimed
// here, unless the key has one.
func (t *keyTable) claimed(it *item) {
	key, seq := chainKey(it), it.env.seq
	if seq <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.chains[key] == nil {
		t.chains[key] = &keyChain{running: seq, tail: seq, moved: time.Now(), claimed: true}
		t.note(key, func(s *keySeen) { s.leased = max(s.leased, seq) })
	}
}

// delivered records that it, an ordered event, was delivered to every
// subscription here, and returns the next event of its chain, now
// running, if any.
func (t *keyTable) delivered(it *item) *item {
	key, seq := chainKey(it), it.env.seq
	if seq <= 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.note(key, func(s *keySeen) { s.delivered = max(s.delivered, seq) })
	c := t.chains[key]
	if c == nil || c.running != seq {
		return nil
	}
	if len(c.waiting) == 0 {
		t.end(key)
		return nil
	}
	next := c.waiting[0]
	c.waiting[0] = nil
	c.waiting = c.waiting[1:]
	c.running, c.moved = next.env.seq, time.Now()
	return next
}

// deliveredBehind is delivered for it, an ordered event delivered to every
// subscription here but those it.behind names, which owe an earlier event
// of its key (they get it later, claimed one subscription at a time): the
// next event of its chain goes on only if it owes those too (one claimed
// in a run behind it, with Row.Behind); else the chain ends, and its
// events are returned to be given back. The key is not recorded as
// delivered here: it was not, to those.
func (t *keyTable) deliveredBehind(it *item) (next *item, back []*item) {
	key, seq := chainKey(it), it.env.seq
	if seq <= 0 {
		return nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.chains[key]
	if c == nil || c.running != seq {
		return nil, nil
	}
	if len(c.waiting) == 0 || !covers(c.waiting[0].behind, it.behind) {
		t.end(key)
		return nil, c.waiting
	}
	next = c.waiting[0]
	c.waiting[0] = nil
	c.waiting = c.waiting[1:]
	c.running, c.moved = next.env.seq, time.Now()
	return next, nil
}

// covers reports whether every name of b is in a.
func covers(a, b []string) bool {
	for _, n := range b {
		if !slices.Contains(a, n) {
			return false
		}
	}
	return true
}

// holdsAfter reports whether an event of key numbered after seq is in this
// instance's hands (its key's chain reaches past seq) or was delivered here:
// then nobody needs to look for the key's next event in the table when
// seq's outcome is recorded. A later event given back to the table is
// neither (its chain ended), and is looked for.
func (t *keyTable) holdsAfter(key string, seq int64) bool {
	if seq <= 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.chains[key]; c != nil && c.tail > seq {
		return true
	}
	return t.seen(key).delivered > seq
}

// failed ends the chain of it, an ordered event not delivered here (a
// failure, a shutdown, no subscription), and returns the events that
// waited behind it: they must be given back.
func (t *keyTable) failed(it *item) []*item {
	key, seq := chainKey(it), it.env.seq
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.chains[key]
	if c == nil || c.running != seq {
		return nil
	}
	t.end(key)
	if it.sub == nil {
		t.forgetLeased(key)
	}
	return c.waiting
}

// forgetLeased lowers the highest number of key leased here to the
// highest delivered here, once key has no chain (t.mu held): the events
// leased here past it were given back (a failure, a give-back at
// commit), and Publish must stop passing them as Row.KeyAfter. Else each
// later event of a key held up in the table (a failing or paused
// subscription) would be written leased here, only to be given back at
// its commit, and a burst of them could overflow what the poller
// releases, leaving them to wait for their leases to run out.
func (t *keyTable) forgetLeased(key string) {
	if t.chains[key] != nil {
		return
	}
	t.note(key, func(s *keySeen) { s.leased = min(s.leased, s.delivered) })
}

// staleChain is a chain that stale ended: the number of the event that
// did not finish, and the events that waited behind it.
type staleChain struct {
	running int64
	waiting []*item
}

// stale ends the chains that have events waiting but have not moved since
// before, and returns them by chain key.
func (t *keyTable) stale(before time.Time) map[string]staleChain {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out map[string]staleChain
	for key, c := range t.chains {
		if len(c.waiting) == 0 || !c.moved.Before(before) {
			continue
		}
		if out == nil {
			out = map[string]staleChain{}
		}
		out[key] = staleChain{running: c.running, waiting: c.waiting}
		t.end(key)
		if c.waiting[0].sub == nil {
			t.forgetLeased(key)
		}
	}
	return out
}

// drain ends every chain and returns the events that waited in them.
func (t *keyTable) drain() []*item {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*item
	for k, c := range t.chains {
		out = append(out, c.waiting...)
		t.end(k)
	}
	return out
}

// --- the dispatcher's side ---

// enqueueOrdered hands over an ordered event leased to this instance
// whose transaction committed: it goes to the hot queue if it is its
// key's head, waits in its key's chain if the event before it is in
// this instance's hands, or goes back to the table.
func (d *dispatcher) enqueueOrdered(env Envelope, head bool, written time.Time) {
	it := d.committed(env, written)
	if it == nil {
		return
	}
	switch d.keys.committed(it, head) {
	case commitGo:
		d.pushChained(it)
	case commitWait:
		// In the in-flight set: its lease is renewed while it waits.
	case commitRelease:
		d.giveBack(env.OrderingKey, it)
	}
}

// giveBack takes events of key out of this instance's hands: the poller
// releases their leases, and the sequencer looks for the key's head.
// Deliveries (a run of one subscription's) are released here, and the
// poll, which claims them, is woken.
func (d *dispatcher) giveBack(key string, its ...*item) {
	ids, keys := leaseNames(its)
	for _, it := range its {
		d.leases.letGo(it.key())
	}
	for _, id := range ids {
		d.dropToPoller(id)
	}
	if len(keys) > 0 {
		ctx, cancel := d.storeCtx()
		d.leases.releaseDeliveries(ctx, keys, 0, "give back deliveries that waited behind another of their key")
		cancel()
		d.sig.wakePoll()
	}
	d.sig.name(key)
}

// leaseNames returns what holds the leases of its: the ids of the events
// leased as a whole, the keys of the deliveries.
func leaseNames(its []*item) (ids []string, keys []driver.DeliveryID) {
	for _, it := range its {
		if it.sub == nil {
			ids = append(ids, it.env.ID)
		} else {
			keys = append(keys, driver.DeliveryID{EventID: it.env.ID, Subscription: it.sub.Name})
		}
	}
	return ids, keys
}

// pushChained puts a running event of a chain into the hot queue; if the
// queue is full, it and those behind it go back to the table.
func (d *dispatcher) pushChained(it *item) {
	select {
	case d.hot <- it:
		d.m.HotEnqueued()
	default:
		d.m.HotDropped()
		d.log.Warn("hot queue full; ordered event left to the poller",
			slog.String("event_id", it.env.ID), slog.String("event_type", string(it.env.Type)), slog.Int("capacity", cap(d.hot)))
		d.giveBack(it.env.OrderingKey, append(d.keys.failed(it), it)...)
	}
}

// dropToPoller asks the poller to release the lease of id, an event this
// instance will not deliver now, so that it is due at once; if even that
// list is full, the lease runs out by itself.
func (d *dispatcher) dropToPoller(id string) {
	if !d.sig.drop(id) {
		d.log.Warn("overflow list full too: event waits for its lease to expire",
			slog.String("event_id", id), slog.Duration("lease", d.cfg.Lease))
	}
	d.sig.wakePoll()
}

// chainDelivered passes the key of it, an ordered event just delivered
// here, to the next event of its chain, and reports whether there was
// one.
func (d *dispatcher) chainDelivered(it *item) bool {
	if !chained(it) {
		return false
	}
	next := d.keys.delivered(it)
	if next == nil {
		return false
	}
	d.pushChained(next)
	return true
}

// chainDeliveredBehind is chainDelivered for it, delivered to every
// subscription here but those behind (it.behind): the next event of its
// chain goes on if it owes those too, else those behind it are given back.
func (d *dispatcher) chainDeliveredBehind(ctx context.Context, it *item) bool {
	if !chained(it) {
		return false
	}
	next, back := d.keys.deliveredBehind(it)
	if next != nil {
		d.pushChained(next)
		return true
	}
	if len(back) > 0 {
		d.giveBackNow(ctx, it.env.OrderingKey, back)
	}
	return false
}

// chainFailed gives back the events that waited behind it, an ordered
// event that was not delivered here.
func (d *dispatcher) chainFailed(ctx context.Context, it *item) {
	if !chained(it) {
		return
	}
	if back := d.keys.failed(it); len(back) > 0 {
		d.giveBackNow(ctx, it.env.OrderingKey, back)
	}
}

// watchChains bounds the wait in a chain: every Lease/2 it gives back
// the events that have waited for longer than a lease behind an event
// that has not finished (the chain has not moved), so that a delivery
// stuck in a handler, or a chain this instance lost track of, holds back
// nothing but its own event. The events wait in the table behind it, and
// go out as heads once it is done. It runs from start until Close begins.
func (d *dispatcher) watchChains(ctx context.Context) {
	defer close(d.chainsDone)
	t := time.NewTicker(d.cfg.Lease / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.draining:
			return
		case r := <-d.refused:
			sctx, cancel := d.storeCtx()
			d.registryChanged(sctx, r.version, r.its)
			cancel()
			continue
		case <-t.C:
		}
		for _, c := range d.keys.stale(time.Now().Add(-d.cfg.Lease)) {
			first := c.waiting[0]
			d.log.Warn("events waited in their key's chain for longer than a lease behind one that has not finished: given back to wait in the table",
				slog.String("event_id", first.env.ID), slog.Int("events", len(c.waiting)), slog.Int64("behind_number", c.running), slog.Duration("lease", d.cfg.Lease))
			sctx, cancel := d.storeCtx()
			d.giveBackNow(sctx, first.env.OrderingKey, c.waiting)
			cancel()
		}
	}
}

// giveBackNow releases the leases of back, events of key that waited in
// a chain, and has key's next head looked for.
func (d *dispatcher) giveBackNow(ctx context.Context, key string, back []*item) {
	ids, keys := leaseNames(back)
	d.leases.releaseLeases(ctx, ids, "give back events that waited behind a failed one of their key")
	d.leases.releaseDeliveries(ctx, keys, 0, "give back deliveries that waited behind a failed one of their key")
	for _, w := range back {
		d.leases.letGo(w.key())
	}
	if len(keys) > 0 {
		d.sig.wakePoll()
	}
	d.sig.name(key)
}
