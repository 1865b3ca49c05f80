package outboxtest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Per-key ordering (driver.OrderedStore), with the semantics of
// outbox/sqlstore: an ordered event carries its key and its number in the
// key's sequence (Row.KeySeq); a key's head is its earliest event still
// pending under the OrderFilter; only heads are leased, by InsertOrdered
// (to the publisher, when nothing earlier is pending) and ClaimHeads, and
// the events behind a head to the instance that holds it (Row.KeyAfter,
// ClaimRequest.Run).
//
// Like sqlstore, publishing an event of a key locks the key until the
// transaction ends: another transaction publishing the key waits for it
// (or fails with ErrDeadlock if it holds a key the first waits for, as a
// database would), so that the sequence is the commit order of the
// publishers and a rolled-back transaction gives its numbers back (no
// gaps).

// MaxOrderingKeyLen is the longest ordering key the store accepts, in
// bytes, as sqlstore's table.
const MaxOrderingKeyLen = 255

// pendingUnder reports whether e, an ordered event, holds back the later
// events of its key under f: NEW or RETRY; DEAD while f.Block is not
// empty; split with a delivery of f.Block not DONE, or of f.Skip NEW or
// RETRY. The caller holds s.mu.
func (s *Store) pendingUnder(e *memEvent, f driver.OrderFilter) bool {
	switch e.row.Status {
	case outbox.StatusNew, outbox.StatusRetry:
		return true
	case outbox.StatusDead:
		return len(f.Block) > 0
	case outbox.StatusSplit:
		for name, d := range s.deliv[e.row.ID] {
			switch {
			case slices.Contains(f.Block, name) && (undone(d.status) || d.status == outbox.StatusDead):
				return true
			case slices.Contains(f.Skip, name) && undone(d.status):
				return true
			}
		}
	}
	return false
}

// pendingFor reports whether e, an ordered event, holds back the later
// events of its key for the ordered subscription sub under f: NEW or
// RETRY; DEAD if sub blocks; split with a delivery to sub NEW or RETRY,
// or DEAD if sub blocks. The caller holds s.mu.
func (s *Store) pendingFor(e *memEvent, sub string, f driver.OrderFilter) bool {
	switch e.row.Status {
	case outbox.StatusNew, outbox.StatusRetry:
		return true
	case outbox.StatusDead:
		return f.Blocks(sub)
	case outbox.StatusSplit:
		d := s.deliv[e.row.ID][sub]
		return d != nil && (undone(d.status) || (d.status == outbox.StatusDead && f.Blocks(sub)))
	}
	return false
}

// owes reports whether an event of es numbered before seq is pending for
// sub under f. The caller holds s.mu.
func (s *Store) owes(es []*memEvent, seq int64, sub string, f driver.OrderFilter) bool {
	for _, e := range es {
		if e.row.KeySeq < seq && s.pendingFor(e, sub, f) {
			return true
		}
	}
	return false
}

// inFlight reports whether an event of es other than e is in flight to
// sub: leased as a whole, or split with its delivery to sub leased. The
// caller holds s.mu.
func (s *Store) inFlight(es []*memEvent, e *memEvent, sub string, now time.Time) bool {
	for _, o := range es {
		if o == e {
			continue
		}
		if undone(o.row.Status) && !free(o.lockedUntil, now) {
			return true
		}
		if d := s.deliv[o.row.ID][sub]; o.row.Status == outbox.StatusSplit && d != nil && undone(d.status) && !free(d.lockedUntil, now) {
			return true
		}
	}
	return false
}

// keyEvents returns the committed ordered events of the given keys (all
// keys if keys is nil), key by key, in sequence order. The caller holds
// s.mu.
func (s *Store) keyEvents(keys []string) map[string][]*memEvent {
	out := map[string][]*memEvent{}
	for _, e := range s.events {
		if e.row.KeySeq == 0 || (keys != nil && !slices.Contains(keys, e.row.OrderingKey)) {
			continue
		}
		out[e.row.OrderingKey] = append(out[e.row.OrderingKey], e)
	}
	for _, es := range out {
		slices.SortFunc(es, func(a, b *memEvent) int { return cmp.Compare(a.row.KeySeq, b.row.KeySeq) })
	}
	return out
}

// head returns the earliest of es that is NEW or RETRY as a whole, or
// nil: the events before it are delivered, dead or split.
func head(es []*memEvent) *memEvent {
	for _, e := range es {
		if undone(e.row.Status) {
			return e
		}
	}
	return nil
}

// ErrDeadlock is returned by InsertOrdered when the transaction would wait
// for a key held by a transaction that waits, directly or not, for a key
// it holds: like a database, the store refuses the wait instead of
// hanging both. Roll the transaction back and try again.
var ErrDeadlock = errors.New("outboxtest: deadlock: this transaction and another each wait for an ordering key the other holds; roll back and retry")

// lockKey makes tx the holder of key until it ends, waiting while another
// open transaction holds it.
func (s *Store) lockKey(ctx context.Context, tx *Tx, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		h := s.keyHolder[key]
		if h == nil || h == tx {
			break
		}
		for u := h; u != nil; u = u.waitingFor {
			if u == tx {
				return ErrDeadlock
			}
		}
		tx.waitingFor = h
		ended := h.endedChan()
		s.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
		}
		s.mu.Lock()
		tx.waitingFor = nil
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	if s.keyHolder[key] == nil {
		s.keyHolder[key] = tx
		if tx.keyBase == nil {
			tx.keyBase = map[string]int64{}
		}
		tx.keyBase[key] = s.keySeq[key]
	}
	return nil
}

// unlockKeys releases the keys tx holds, giving their numbers back if it
// rolled back. The caller holds s.mu.
func (s *Store) unlockKeys(tx *Tx, rolledBack bool) {
	for k, base := range tx.keyBase {
		if s.keyHolder[k] == tx {
			delete(s.keyHolder, k)
			if rolledBack {
				s.keySeq[k] = base
			}
		}
	}
	close(tx.endedChan())
}

// unstage forgets the ordered rows of a transaction that ended.
func (s *Store) unstage(rows []*memEvent, tx *Tx) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range rows {
		delete(s.staging, e)
	}
	s.unlockKeys(tx, true)
}

// InsertOrdered implements driver.OrderedStore: the row is numbered next
// in its key's sequence at once (see the note above on locking) and
// staged in exec, a *Tx of this store, until it commits. It is the head,
// and leased to owner, if no earlier event of its key is pending under f,
// committed or staged in an open transaction; it is leased to owner too
// if numbered row.KeyAfter+1.
func (s *Store) InsertOrdered(ctx context.Context, exec driver.Execer, row *driver.Row, owner string, lease time.Duration, f driver.OrderFilter) (head, leased bool, err error) {
	switch {
	case row.OrderingKey == "":
		return false, false, fmt.Errorf("outboxtest: event %s has no ordering key: set Envelope.OrderingKey or the aggregate's type and id", row.ID)
	case len(row.OrderingKey) > MaxOrderingKeyLen:
		return false, false, fmt.Errorf("outboxtest: event %s: ordering key of %d bytes; at most %d fit", row.ID, len(row.OrderingKey), MaxOrderingKeyLen)
	}
	tx, err := s.txOf(exec)
	if err != nil {
		return false, false, err
	}
	if err := s.lockKey(ctx, tx, row.OrderingKey); err != nil {
		return false, false, err
	}
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return false, false, sql.ErrTxDone
	}
	for _, e := range tx.rows {
		if e.row.ID == row.ID {
			return false, false, fmt.Errorf("outboxtest: insert: event id %q exists already", row.ID)
		}
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.events[row.ID]; dup {
		return false, false, fmt.Errorf("outboxtest: insert: event id %q exists already", row.ID)
	}
	k := row.OrderingKey
	s.keySeq[k]++
	seq := s.keySeq[k]
	head = true
	for _, e := range s.events {
		if e.row.OrderingKey == k && e.row.KeySeq != 0 && e.row.KeySeq < seq && s.pendingUnder(e, f) {
			head = false
			break
		}
	}
	for e := range s.staging {
		if e.row.OrderingKey == k && e.row.KeySeq < seq {
			head = false // NEW, in an open transaction
			break
		}
	}
	r := cloneRow(row)
	r.Status, r.Attempts, r.CreatedAt, r.PrevOwner, r.ReadError, r.KeySeq = outbox.StatusNew, 0, now, "", nil, seq
	e := &memEvent{row: r, availableAt: now}
	leased = owner != "" && (head || (row.KeyAfter > 0 && seq == row.KeyAfter+1))
	if leased {
		e.owner, e.lockedUntil = owner, now.Add(lease)
	}
	s.staging[e] = struct{}{}
	tx.rows = append(tx.rows, e)
	row.KeySeq = seq
	return head, leased, nil
}

// ClaimHeads implements driver.OrderedStore.
func (s *Store) ClaimHeads(ctx context.Context, req driver.ClaimRequest, keys []string, f driver.OrderFilter) ([]driver.Row, error) {
	if len(keys) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	perKey := req.Run / min(len(keys), req.Limit)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	byKey := s.keyEvents(keys)
	var out []driver.Row
	heads := 0
	for _, k := range keys {
		if heads == req.Limit {
			break
		}
		h := head(byKey[k])
		if h == nil || h.availableAt.After(now) || !free(h.lockedUntil, now) {
			continue
		}
		// Another event of the key under a live lease (a later one, when
		// the head was replayed): one at a time.
		if slices.ContainsFunc(byKey[k], func(e *memEvent) bool {
			return e != h && undone(e.row.Status) && !free(e.lockedUntil, now)
		}) {
			continue
		}
		r := cloneRow(&h.row)
		if h.owner != req.Owner {
			r.PrevOwner = h.owner
		}
		for _, sub := range slices.Sorted(slices.Values(slices.Concat(f.Block, f.Skip))) {
			if s.owes(byKey[k], h.row.KeySeq, sub, f) || s.inFlight(byKey[k], h, sub, now) {
				r.Behind = append(r.Behind, sub)
			}
		}
		if f.AllBehind(r.Behind) {
			continue // every subscription owes an earlier event first
		}
		h.owner, h.lockedUntil = req.Owner, now.Add(req.Lease)
		out = append(out, r)
		heads++
		out = s.leaseRun(out, byKey[k], h, req.Owner, req.Lease, perKey, r.Behind, f, now)
	}
	if len(out) > 0 {
		s.touch()
	}
	return out, nil
}

// leaseRun leases to owner up to run events of es that follow h without a
// gap, NEW or RETRY as a whole, due and free, with h's
// behind, which they get, and appends them to out. The caller holds s.mu.
func (s *Store) leaseRun(out []driver.Row, es []*memEvent, h *memEvent, owner string, lease time.Duration, run int, behind []string, f driver.OrderFilter, now time.Time) []driver.Row {
	if run <= 0 {
		return out
	}
	seq, n := h.row.KeySeq, 0
	for _, e := range es {
		if e.row.KeySeq <= seq {
			continue
		}
		if n == run || e.row.KeySeq != seq+1 || !undone(e.row.Status) || e.availableAt.After(now) || !free(e.lockedUntil, now) {
			break
		}
		r := cloneRow(&e.row)
		r.Behind = slices.Clone(behind)
		if e.owner != owner {
			r.PrevOwner = e.owner
		}
		e.owner, e.lockedUntil = owner, now.Add(lease)
		out = append(out, r)
		seq, n = e.row.KeySeq, n+1
	}
	return out
}

var _ driver.OrderedStore = (*Store)(nil)

// KeysDone implements driver.OrderedStore. The in-memory store decides
// heads from the events themselves, under its mutex: it needs no hint.
func (s *Store) KeysDone(ctx context.Context, evs []driver.KeyDone, f driver.OrderFilter) error {
	return ctx.Err()
}

// MarkDoneKeys implements driver.OrderedStore: MarkDone (the in-memory
// store needs no record of keys); later are the keys of evs numbered
// beyond the events given.
func (s *Store) MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []driver.KeyDone, registry int64) (int, []string, error) {
	n, err := s.MarkDone(ctx, owner, ids, registry)
	if err != nil {
		return n, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var later []string
	for _, ev := range evs {
		if (n != len(ids) || s.keySeq[ev.Key] > ev.Seq) && !slices.Contains(later, ev.Key) {
			later = append(later, ev.Key)
		}
	}
	slices.Sort(later)
	return n, later, nil
}

// DueKeys implements driver.OrderedStore.
func (s *Store) DueKeys(ctx context.Context, after string, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	due := map[string]bool{}
	for _, e := range s.events {
		if e.row.KeySeq != 0 && e.row.OrderingKey > after && undone(e.row.Status) && !e.availableAt.After(now) && free(e.lockedUntil, now) {
			due[e.row.OrderingKey] = true
		}
	}
	keys := slices.Sorted(mapKeys(due))
	return keys[:min(len(keys), limit)], nil
}

// BlockedKeys implements driver.OrderedStore: a key is blocked for a
// subscription of f.Block when its earliest event pending for it is dead
// for it (DEAD as a whole, or split with a dead delivery to it).
func (s *Store) BlockedKeys(ctx context.Context, f driver.OrderFilter, after string, limit int) ([]driver.BlockedKey, error) {
	if limit <= 0 || len(f.Block) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	byKey := s.keyEvents(nil)
	var out []driver.BlockedKey
	for _, k := range slices.Sorted(mapKeys(byKey)) {
		if k <= after {
			continue
		}
		if len(out) == limit {
			break
		}
		es := byKey[k]
		var b *driver.BlockedKey
		var by *memEvent
		for _, sub := range slices.Sorted(slices.Values(f.Block)) {
			var first *memEvent
			for _, e := range es {
				if s.pendingFor(e, sub, f) {
					first = e
					break
				}
			}
			if first == nil || !s.deadFor(first, sub) || (by != nil && by.row.KeySeq <= first.row.KeySeq) {
				continue
			}
			by = first
			b = &driver.BlockedKey{Key: k, Subscription: sub, EventID: first.row.ID, Type: first.row.Type, Since: first.row.CreatedAt}
			if first.row.Status == outbox.StatusDead {
				b.Subscription = "" // every blocking subscription
			}
		}
		if b == nil {
			continue
		}
		for _, e := range es {
			if e.row.KeySeq > by.row.KeySeq && ((b.Subscription == "" && s.pendingUnder(e, f)) || (b.Subscription != "" && s.pendingFor(e, b.Subscription, f))) {
				b.Waiting++
			}
		}
		out = append(out, *b)
	}
	return out, nil
}

// deadFor reports whether e is DEAD, or split with a dead delivery to sub.
// The caller holds s.mu.
func (s *Store) deadFor(e *memEvent, sub string) bool {
	switch e.row.Status {
	case outbox.StatusDead:
		return true
	case outbox.StatusSplit:
		d := s.deliv[e.row.ID][sub]
		return d != nil && d.status == outbox.StatusDead
	}
	return false
}

// SkipDead implements driver.OrderedStore.
func (s *Store) SkipDead(ctx context.Context, ids []string) (int, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		e := s.events[id]
		if e == nil {
			continue
		}
		if e.row.Status == outbox.StatusDead {
			e.row.Status, e.doneAt, e.owner, e.lockedUntil = outbox.StatusDone, now, "", time.Time{}
			n++
		}
		for _, d := range s.deliv[id] {
			if d.status == outbox.StatusDead {
				d.status, d.doneAt, d.owner, d.lockedUntil = outbox.StatusDone, now, "", time.Time{}
				n++
			}
		}
		if e.row.Status == outbox.StatusSplit {
			all := true
			for _, d := range s.deliv[id] {
				all = all && d.status == outbox.StatusDone
			}
			if all {
				e.row.Status, e.doneAt = outbox.StatusDone, now
			}
		}
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}
