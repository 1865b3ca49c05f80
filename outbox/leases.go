package outbox

import (
	"context"
	"log/slog"
	"time"
)

// The lease keeper: renews the leases of everything this instance holds,
// and gives leases back (on close, on overflow, for events it cannot
// deliver).

// handBack empties the queues and releases the leases of what was in them.
func (o *Outbox) handBack() {
	var ids []string
	var keys []DeliveryKey
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
			keys = append(keys, DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
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
func (o *Outbox) releaseDeliveries(ctx context.Context, keys []DeliveryKey, delay time.Duration, what string) {
	for len(keys) > 0 {
		n := min(500, len(keys))
		if err := o.dstore.ReleaseDeliveries(ctx, o.cfg.InstanceID, keys[:n], delay); err != nil {
			o.log.Error(what, slog.Int("deliveries", n), slog.Any("error", err))
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
	for chunk := range chunks(ids, 500) {
		if err := o.store.Release(ctx, o.cfg.InstanceID, chunk, delay); err != nil {
			o.log.Error(what, slog.Int("events", len(chunk)), slog.Any("error", err))
		}
	}
}

func (o *Outbox) renewLeases(ctx context.Context) {
	t := time.NewTicker(o.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var ids []string
		var keys []DeliveryKey
		for _, k := range o.inflight.snapshot() {
			if dk, ok := parseDeliveryKey(k); ok {
				keys = append(keys, dk)
			} else {
				ids = append(ids, k)
			}
		}
		for len(keys) > 0 {
			n := min(500, len(keys))
			wctx, cancel := context.WithTimeout(ctx, o.cfg.Lease/3)
			if _, err := o.dstore.ExtendDeliveryLeases(wctx, o.cfg.InstanceID, keys[:n], o.cfg.Lease); err != nil && ctx.Err() == nil {
				o.log.Error("renew delivery leases", slog.Int("deliveries", n), slog.Any("error", err))
			}
			cancel()
			keys = keys[n:]
		}
		for chunk := range chunks(ids, 500) {
			wctx, cancel := context.WithTimeout(ctx, o.cfg.Lease/3)
			if _, err := o.store.ExtendLeases(wctx, o.cfg.InstanceID, chunk, o.cfg.Lease); err != nil && ctx.Err() == nil {
				o.log.Error("renew leases", slog.Int("events", len(chunk)), slog.Any("error", err))
			}
			cancel()
		}
	}
}
