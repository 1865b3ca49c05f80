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
	var local []outbox.SubscriptionStatus
	for _, sub := range ob.Subscriptions() {
		if sub.Local {
			local = append(local, sub)
		}
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	active := func(sub outbox.SubscriptionStatus) bool {
		m := s.subs[sub.Name]
		return m == nil || !m.paused
	}
	takes := func(t outbox.EventType) bool {
		for _, sub := range local {
			if active(sub) && (sub.Types == nil || slices.Contains(sub.Types, t)) {
				return true
			}
		}
		return false
	}
	// An ordered event waits as a whole while an earlier event of its key
	// is NEW or RETRY as a whole (ClaimHeads takes one head per key); a
	// delivery to an ordered subscription waits while an earlier event of
	// its key is pending for that subscription (ClaimDeliveries). Neither
	// is due work until then.
	var f driver.OrderFilter
	for name, m := range s.subs {
		switch outbox.Order(m.order) {
		case outbox.Ordered:
			f.Block = append(f.Block, name)
		case outbox.OrderedSkipDead:
			f.Skip = append(f.Skip, name)
		}
	}
	var byKey map[string][]*memEvent
	keyOf := func(e *memEvent) []*memEvent {
		if byKey == nil {
			byKey = s.keyEvents(nil)
		}
		return byKey[e.row.OrderingKey]
	}
	// waiting: not its key's head, or every local subscription that takes
	// it owes an earlier event of the key (ClaimHeads leaves it whole).
	waiting := func(e *memEvent) bool {
		if e.row.KeySeq == 0 {
			return false
		}
		es := keyOf(e)
		if slices.ContainsFunc(es, func(o *memEvent) bool { return o.row.KeySeq < e.row.KeySeq && undone(o.row.Status) }) {
			return true
		}
		for _, sub := range local {
			if active(sub) && (sub.Types == nil || slices.Contains(sub.Types, outbox.EventType(e.row.Type))) &&
				!(f.Ordered(sub.Name) && s.owes(es, e.row.KeySeq, sub.Name, f)) {
				return false
			}
		}
		return true
	}
	owes := func(e *memEvent, sub string) bool {
		return e != nil && e.row.KeySeq != 0 && f.Ordered(sub) && s.owes(keyOf(e), e.row.KeySeq, sub, f)
	}
	for id, e := range s.events {
		if undone(e.row.Status) {
			if !free(e.lockedUntil, now) || (!e.availableAt.After(now) && takes(outbox.EventType(e.row.Type)) && !waiting(e)) {
				return true
			}
		}
		for name, d := range s.deliv[id] {
			if !undone(d.status) {
				continue
			}
			if !free(d.lockedUntil, now) {
				return true
			}
			if !d.availableAt.After(now) && !owes(e, name) && slices.ContainsFunc(local, func(sub outbox.SubscriptionStatus) bool { return sub.Name == name && active(sub) }) {
				return true
			}
		}
	}
	return false
}
