package outboxtest

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// drainTick bounds the wait between two polls of Drain when the store does
// not change: events younger than Config.SkipRecent become claimable by
// the passing of time alone.
const drainTick = 5 * time.Millisecond

// Drain delivers everything due through ob, a started Outbox on s, and
// returns once ob is idle: nothing is leased (no delivery in progress,
// no completion pending), no event or delivery that one of ob's own
// unpaused subscriptions takes is due, and ob's queues are empty. It polls
// (ob.Poll) whenever the store changes, so it does not wait for the
// engine's poll interval.
//
// Retries scheduled for later, deliveries deferred by an open circuit and
// events handed back for another instance are not due, and Drain does not
// wait for them: move the clock (in a testing/synctest bubble, sleep) and
// Drain again. Drain returns ctx's error if ob does not settle, which is
// what happens when ob was not started (nothing runs the handlers) or a
// lease is held by an instance that is gone.
func (s *Store) Drain(ctx context.Context, ob *outbox.Outbox) error {
	for {
		changed := s.changes()
		n, err := ob.Poll(ctx)
		if err != nil {
			return fmt.Errorf("outboxtest: drain: %w", err)
		}
		hot, cold := ob.QueueDepths()
		if n == 0 && hot == 0 && cold == 0 && !s.busy(ob) {
			return nil
		}
		t := time.NewTimer(drainTick)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("outboxtest: drain: not idle: %w", ctx.Err())
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// busy reports whether ob has work in s: a live lease, or an event or
// delivery due for one of its unpaused subscriptions.
func (s *Store) busy(ob *outbox.Outbox) bool {
	local := localSubscriptions(ob)
	s.mu.Lock()
	defer s.mu.Unlock()
	// Read under the lock: a write that came between an earlier reading
	// and the lock (a retry due at once, say) would be due after it, and
	// look like no work.
	now := s.now()
	w := &workCheck{s: s, local: local, now: now, f: s.orderFilter()}
	for id, e := range s.events {
		if w.eventBusy(e) {
			return true
		}
		for name, d := range s.deliv[id] {
			if w.deliveryBusy(e, name, d) {
				return true
			}
		}
	}
	return false
}

// localSubscriptions returns ob's own subscriptions.
func localSubscriptions(ob *outbox.Outbox) []outbox.SubscriptionStatus {
	var local []outbox.SubscriptionStatus
	for _, sub := range ob.Subscriptions() {
		if sub.Local {
			local = append(local, sub)
		}
	}
	return local
}

// orderFilter returns the OrderFilter of every ordered subscription in s
// (the filter the engine claims with). The caller holds s.mu.
func (s *Store) orderFilter() driver.OrderFilter {
	var f driver.OrderFilter
	for name, m := range s.subs {
		switch outbox.Order(m.order) {
		case outbox.Ordered:
			f.Block = append(f.Block, name)
		case outbox.OrderedSkipDead:
			f.Skip = append(f.Skip, name)
		}
	}
	return f
}

// workCheck is one check of busy: whether an event or a delivery of s is
// work of an Outbox whose own subscriptions are local, at now. Its
// methods are called with s.mu held.
//
// An ordered event waits as a whole while an earlier event of its key is
// NEW or RETRY as a whole (ClaimHeads takes one head per key); a delivery
// to an ordered subscription waits while an earlier event of its key is
// pending for that subscription (ClaimDeliveries). Neither is due work
// until then.
type workCheck struct {
	s     *Store
	local []outbox.SubscriptionStatus
	now   time.Time
	f     driver.OrderFilter     // s's ordered subscriptions
	byKey map[string][]*memEvent // s.keyEvents(nil), built on first use
}

// eventBusy reports whether e, as a whole event, is work: leased, or NEW
// or RETRY, due, taken by an active local subscription and not waiting
// behind its key.
func (w *workCheck) eventBusy(e *memEvent) bool {
	if !undone(e.row.Status) {
		return false
	}
	if !free(e.lockedUntil, w.now) {
		return true
	}
	return !e.availableAt.After(w.now) && w.taken(outbox.EventType(e.row.Type)) && !w.waiting(e)
}

// deliveryBusy reports whether d, the delivery of e to subscription name,
// is work: leased, or NEW or RETRY, due, not owing an earlier event of
// its key, and to an active local subscription.
func (w *workCheck) deliveryBusy(e *memEvent, name string, d *memDelivery) bool {
	if !undone(d.status) {
		return false
	}
	if !free(d.lockedUntil, w.now) {
		return true
	}
	return !d.availableAt.After(w.now) && !w.owes(e, name) && w.activeLocal(name)
}

// active reports whether sub is not paused in the store.
func (w *workCheck) active(sub outbox.SubscriptionStatus) bool {
	m := w.s.subs[sub.Name]
	return m == nil || !m.paused
}

// takes reports whether sub is active and takes events of type t.
func (w *workCheck) takes(sub outbox.SubscriptionStatus, t outbox.EventType) bool {
	return w.active(sub) && (sub.Types == nil || slices.Contains(sub.Types, t))
}

// taken reports whether some local subscription takes events of type t.
func (w *workCheck) taken(t outbox.EventType) bool {
	for _, sub := range w.local {
		if w.takes(sub, t) {
			return true
		}
	}
	return false
}

// activeLocal reports whether name is an active local subscription.
func (w *workCheck) activeLocal(name string) bool {
	for _, sub := range w.local {
		if sub.Name == name && w.active(sub) {
			return true
		}
	}
	return false
}

// keyOf returns the ordered events of e's key, in sequence order.
func (w *workCheck) keyOf(e *memEvent) []*memEvent {
	if w.byKey == nil {
		w.byKey = w.s.keyEvents(nil)
	}
	return w.byKey[e.row.OrderingKey]
}

// waiting reports whether e, an event NEW or RETRY as a whole, waits
// behind its key: it is not its key's head, or every local subscription
// that takes it owes an earlier event of the key (ClaimHeads leaves it
// whole). An unordered event never waits.
func (w *workCheck) waiting(e *memEvent) bool {
	if e.row.KeySeq == 0 {
		return false
	}
	es := w.keyOf(e)
	if earlierUndone(es, e.row.KeySeq) {
		return true
	}
	t := outbox.EventType(e.row.Type)
	for _, sub := range w.local {
		if w.takes(sub, t) && !(w.f.Ordered(sub.Name) && w.s.owes(es, e.row.KeySeq, sub.Name, w.f)) {
			return false
		}
	}
	return true
}

// owes reports whether the delivery of e to sub waits behind e's key: e
// is ordered, sub is an ordered subscription, and an earlier event of the
// key is pending for sub.
func (w *workCheck) owes(e *memEvent, sub string) bool {
	return e != nil && e.row.KeySeq != 0 && w.f.Ordered(sub) && w.s.owes(w.keyOf(e), e.row.KeySeq, sub, w.f)
}

// earlierUndone reports whether an event of es numbered before seq is NEW
// or RETRY as a whole.
func earlierUndone(es []*memEvent, seq int64) bool {
	for _, o := range es {
		if o.row.KeySeq < seq && undone(o.row.Status) {
			return true
		}
	}
	return false
}
