package outbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// leaseKeeper renews the leases of everything this instance holds (the
// in-flight set) every Lease/3, and gives leases back: on close, on
// hot-queue overflow, for events this instance cannot deliver. Its
// goroutine (run) runs from start until stop.
type leaseKeeper struct {
	store    driver.Store
	dstore   driver.DeliveryStore
	owner    string
	lease    time.Duration
	inflight *inflightSet
	log      *slog.Logger
	health   *health
	m        Metrics
	runner
}

func newLeaseKeeper(d *deps, inflight *inflightSet) *leaseKeeper {
	return &leaseKeeper{store: d.store, dstore: d.dstore, owner: d.cfg.InstanceID, lease: d.cfg.Lease, inflight: inflight, log: d.log, health: d.health, m: d.m}
}

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
		for _, key := range k.inflight.snapshot() {
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
				k.inflight.renewed(deliveryIDStrings(keys[:n]), time.Now(), round.Add(k.lease))
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
				k.inflight.renewed(chunk, time.Now(), round.Add(k.lease))
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
