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
// goroutine runs from Start until the engine's context ends.
type leaseKeeper struct {
	store    driver.Store
	dstore   driver.DeliveryStore
	owner    string
	lease    time.Duration
	inflight *inflightSet
	log      *slog.Logger
	health   *health
	m        Metrics
}

func newLeaseKeeper(o *Outbox) *leaseKeeper {
	return &leaseKeeper{store: o.store, dstore: o.dstore, owner: o.cfg.InstanceID, lease: o.cfg.Lease, inflight: &o.inflight, log: o.log, health: &o.health, m: o.m}
}

// handBack empties the queues and releases the leases of what was in them.
func (o *Outbox) handBack() {
	var ids []string
	var keys []driver.DeliveryKey
	var items []*item
	for {
		var it *item
		select {
		case it = <-o.hot:
		case it = <-o.cold:
		default:
		}
		if it == nil {
			break
		}
		items = append(items, it)
		if it.sub == nil {
			ids = append(ids, it.env.ID)
		} else {
			keys = append(keys, driver.DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
		}
	}
	if len(items) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	o.releaseLeases(ctx, ids, "release leases on close")
	o.releaseDeliveries(ctx, keys, 0, "release deliveries on close")
	for _, it := range items {
		o.inflight.release(it.key())
	}
	o.log.Info("handed queued events back to the database", slog.Int("events", len(items)))
}

// releaseDeliveries is releaseAfter for deliveries.
func (o *Outbox) releaseDeliveries(ctx context.Context, keys []driver.DeliveryKey, delay time.Duration, what string) {
	o.leases.releaseDeliveries(ctx, keys, delay, what)
}

func (k *leaseKeeper) releaseDeliveries(ctx context.Context, keys []driver.DeliveryKey, delay time.Duration, what string) {
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
func (o *Outbox) releaseLeases(ctx context.Context, ids []string, what string) {
	o.releaseAfter(ctx, ids, 0, what)
}

// releaseAfter is releaseLeases with the events due again only after
// delay.
func (o *Outbox) releaseAfter(ctx context.Context, ids []string, delay time.Duration, what string) {
	o.leases.release(ctx, ids, delay, what)
}

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
		var keys []driver.DeliveryKey
		for _, key := range k.inflight.snapshot() {
			if dk, ok := parseDeliveryKey(key); ok {
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
			if err != nil && ctx.Err() == nil {
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
			if err != nil && ctx.Err() == nil {
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
