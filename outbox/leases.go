package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// leaseKeeper renews the leases of everything this instance holds (the
// in-flight set) every Lease/3, and gives leases back: on close, on
// hot-queue overflow, for events this instance cannot deliver. Its
// goroutine (run) runs from start until stop.
type leaseKeeper struct {
	store  driver.Store
	dstore driver.DeliveryStore
	owner  string
	lease  time.Duration
	held   inflightSet // what this instance holds; written only through the methods below
	log    *slog.Logger
	health *health
	m      Metrics
	runner
}

func newLeaseKeeper(d *deps) *leaseKeeper {
	return &leaseKeeper{store: d.store, dstore: d.dstore, owner: d.cfg.InstanceID, lease: d.cfg.Lease, held: inflightSet{m: make(map[string]inflight)}, log: d.log, health: d.health, m: d.m}
}

// The in-flight set is the lease keeper's: the dispatcher adds what it
// queues (hold) and takes out what it finishes (take, letGo), the
// completer lets go of what it has written, a call whose lease the store
// said is gone marks it (lost); the keeper renews what it holds.

// hold adds id, leased until (zero: not known to end), and reports false
// if this instance holds it already (see inflightSet.acquire).
func (k *leaseKeeper) hold(id string, until time.Time) bool { return k.held.acquire(id, until) }

// take lets go of id and reports whether a claim leased it again while it
// was held.
func (k *leaseKeeper) take(id string) (reclaimed bool) { return k.held.take(id) }

// letGo lets go of id: the write that ends this instance's turn with it
// has returned.
func (k *leaseKeeper) letGo(id string) { k.held.release(id) }

// lost notes that id's lease is known to be gone.
func (k *leaseKeeper) lost(id string) { k.held.lost(id) }

// expired reports whether id's lease may have run out by now, or id is no
// longer held (inflightSet.expired).
func (k *leaseKeeper) expired(id string, now time.Time) bool { return k.held.expired(id, now) }

// until returns when id's lease surely ends by this instance's clock (see
// inflightSet), and false if that is not known (it holds id with no known
// end); a zero time with true if it does not hold id.
func (k *leaseKeeper) until(id string) (time.Time, bool) { return k.held.leaseUntil(id) }

// holds reports whether this instance holds id.
func (k *leaseKeeper) holds(id string) bool { return k.held.has(id) }

// holdsNone reports whether this instance holds nothing.
func (k *leaseKeeper) holdsNone() bool { return k.held.empty() }

// releaseDeliveries is release for deliveries.
func (k *leaseKeeper) releaseDeliveries(ctx context.Context, keys []driver.DeliveryID, delay time.Duration, what string) {
	for len(keys) > 0 {
		n := min(500, len(keys))
		start := time.Now()
		err := k.dstore.ReleaseDeliveries(ctx, k.owner, keys[:n], delay)
		k.m.Statement("release", n, time.Since(start))
		if err != nil {
			k.log.Error(what, slog.Int("deliveries", n), slog.Any("error", err))
		}
		keys = keys[n:]
	}
}

// releaseLeases gives up this instance's leases on ids, in statements of
// at most 500 ids. A failure is logged, not returned: the leases then run
// out by themselves and the events are delivered later, never lost.
func (k *leaseKeeper) releaseLeases(ctx context.Context, ids []string, what string) {
	k.release(ctx, ids, 0, what)
}

// release is releaseLeases with the events due again only after delay.
func (k *leaseKeeper) release(ctx context.Context, ids []string, delay time.Duration, what string) {
	for chunk := range chunks(ids, 500) {
		start := time.Now()
		err := k.store.Release(ctx, k.owner, chunk, delay)
		k.m.Statement("release", len(chunk), time.Since(start))
		if err != nil {
			k.log.Error(what, slog.Int("events", len(chunk)), slog.Any("error", err))
		}
	}
}

// run renews leases until ctx ends.
func (k *leaseKeeper) run(ctx context.Context) {
	t := time.NewTicker(k.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var ids []string
		var keys []driver.DeliveryID
		round := time.Now()
		for _, key := range k.held.snapshot() {
			if dk, ok := parseDeliveryID(key); ok {
				keys = append(keys, dk)
			} else {
				ids = append(ids, key)
			}
		}
		failed := false
		for len(keys) > 0 {
			n := min(500, len(keys))
			wctx, cancel := context.WithTimeout(ctx, k.lease/3)
			start := time.Now()
			got, err := k.dstore.ExtendDeliveryLeases(wctx, k.owner, keys[:n], k.lease)
			k.m.Statement("extend_leases", got, time.Since(start))
			if err == nil {
				k.held.renewed(deliveryIDStrings(keys[:n]), time.Now(), round.Add(k.lease))
			} else if ctx.Err() == nil {
				failed = true
				k.log.Error("renew delivery leases", slog.Int("deliveries", n), slog.Any("error", err))
			}
			cancel()
			keys = keys[n:]
		}
		for chunk := range chunks(ids, 500) {
			wctx, cancel := context.WithTimeout(ctx, k.lease/3)
			start := time.Now()
			got, err := k.store.ExtendLeases(wctx, k.owner, chunk, k.lease)
			k.m.Statement("extend_leases", got, time.Since(start))
			if err == nil {
				k.held.renewed(chunk, time.Now(), round.Add(k.lease))
			} else if ctx.Err() == nil {
				failed = true
				k.log.Error("renew leases", slog.Int("events", len(chunk)), slog.Any("error", err))
			}
			cancel()
		}
		if failed {
			k.health.renewFails.Add(1)
		} else {
			k.health.renewFails.Store(0)
		}
	}
}

// deliveryIDStrings returns the in-flight set's names of keys.
func deliveryIDStrings(keys []driver.DeliveryID) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = deliveryKeyString(k.EventID, k.Subscription)
	}
	return out
}

// inflightSet holds the ids this instance has queued or is delivering, so
// that the hot path and the poller never run one event twice at once, and
// so that the lease renewer knows what to renew; with each, the time (on
// this instance's clock) until which its lease surely holds: a lease
// begins on the database after the local time the claim (or insert)
// started, and each renewal extends it from after the local time the
// renewal started.
//
// An id stays in the set until the write that ends this instance's turn
// with it (its outcome, or a release) has returned. A claim that leases it
// meanwhile (its lease ran out while the outcome waited, a freeze, and no
// other instance took it: the store cannot tell this instance's old lease
// from its new one) finds it in the set and does not queue it: one copy at
// most is in hand. Such a claim is noted (in) and, once the write has
// returned, the lease it may have taken is given back (releaseHeld).
type inflightSet struct {
	mu sync.Mutex
	m  map[string]inflight
}

type inflight struct {
	until     time.Time // the lease surely holds until then (zero: not known to end)
	reclaimed bool      // a claim leased it again while it was in the set
}

// acquire adds id, leased until (zero: not known to end), unless it is in
// the set already: then a claim (every caller leased id just before) took
// it again while in hand, which is noted.
func (s *inflightSet) acquire(id string, until time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.m[id]; ok {
		cur.reclaimed = true
		s.m[id] = cur
		return false
	}
	s.m[id] = inflight{until: until}
	return true
}

// renewed notes that a renewal that started before until-Lease and had
// returned by done renewed the leases of ids to until: those of them still
// in the set whose lease held until done (a renewal cannot take back a
// lease another instance took over).
func (s *inflightSet) renewed(ids []string, done, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if cur, ok := s.m[id]; ok && !cur.until.IsZero() && cur.until.After(done) && until.After(cur.until) {
			cur.until = until
			s.m[id] = cur
		}
	}
}

// expired reports whether id's lease may have run out by now: no renewal
// succeeded since, for a whole lease; or id is not in the set any more
// (another path took it out of this instance's hands while a call of it
// waited), so that this instance may not hold it.
func (s *inflightSet) expired(id string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[id]
	return !ok || (!cur.until.IsZero() && now.After(cur.until))
}

func (s *inflightSet) leaseUntil(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[id]
	if !ok {
		return time.Time{}, true
	}
	return cur.until, !cur.until.IsZero()
}

func (s *inflightSet) empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m) == 0
}

func (s *inflightSet) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

func (s *inflightSet) release(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// lost notes that id's lease is known to be gone (the store said so):
// expired reports it from now on.
func (s *inflightSet) lost(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.m[id]; ok {
		cur.until = time.Unix(0, 1)
		s.m[id] = cur
	}
}

// take removes id and reports whether a claim leased it again while it
// was in the set.
func (s *inflightSet) take(id string) (reclaimed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	reclaimed = s.m[id].reclaimed
	delete(s.m, id)
	return reclaimed
}

func (s *inflightSet) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.m))
	for id := range s.m {
		ids = append(ids, id)
	}
	return ids
}
