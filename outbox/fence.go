package outbox

import (
	"context"
	"errors"
	"log/slog"
	"slices"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The registry fence. An event is owed to every subscription registered
// (on any instance) before it committed. process decides the
// subscriptions an event owes from a snapshot of the registry that may be
// a PollInterval old, or older if the instance froze; so the write that
// completes the event for that set (MarkDone, MarkDoneKeys, Split)
// carries the snapshot's version (item.registry), and the store refuses
// it, changing nothing, if a subscription was registered since
// (driver.ErrRegistryChanged). The engine then learns the registry again
// and makes the write anew with the new version: the same DONE for an
// event whose owed set the new registry leaves as it was (the new
// subscription does not take its type: recheck), else a Split with a NEW
// delivery for each subscription elsewhere the event owes now (rewrites,
// resplit): the new subscription gets it, and those that delivered it
// here do not run again. Handing the event back to be delivered anew to
// every subscription (registryChanged) is the fallback when that write
// fails too: a second delivery of an ordered event could then run beside
// a later event of its key that its chain had already passed on.

// fenced reports whether err is the store's refusal of a completing
// write made with a stale registry.
func fenced(err error) bool { return errors.Is(err, driver.ErrRegistryChanged) }

// staleRefusal is what the completer hands back to the dispatcher when the
// store refused the completing write of its for a stale registry (of
// version) and neither writing it again (recheck) nor as a split
// (resplit) recorded it: the dispatcher's watchChains takes them, and
// the events of their keys that wait behind them here, out of this
// instance's hands (registryChanged). It is the completer's one way back
// to the dispatcher: a channel the dispatcher owns and reads.
type staleRefusal struct {
	version int64
	its     []*item
}

// handBack sends its to the dispatcher (staleRefusal). Once the dispatcher has
// stopped reading (Close), they stay as they are: Close releases every
// lease this instance holds, and a lease it could not release runs out.
func (c *completer) handBack(version int64, its []*item) {
	select {
	case c.refused <- staleRefusal{version: version, its: its}:
	case <-c.dispatcherDone:
	}
}

// recheck learns the registry again after the store refused the
// completing write of its, whose subscriptions were decided by the
// registry of version, and returns those of its that owe the same
// subscriptions elsewhere under the new registry, their item.registry set
// to its version: their write can be made again as it was. The others
// must be delivered again (registryChanged).
func (c *completer) recheck(ctx context.Context, version int64, its []*item) []*item {
	if err := c.reg.syncIfOlder(ctx, version); err != nil {
		c.log.Error("learn the subscriptions again after a completion refused for a stale registry; the next refresh will", slog.Any("error", err))
		return nil
	}
	reg := c.reg.load()
	var same []*item
	for _, it := range its {
		if reg.version != version && slices.Equal(it.owed, reg.owedElsewhere(it.env.Type)) {
			it.registry = reg.version
			same = append(same, it)
		}
	}
	return same
}

// rewrites returns writes, the outcomes of it here as its refused
// completing write recorded them, for the registry reg that the instance
// learned since: less the deliveries of subscriptions elsewhere that it
// no longer owes (retired since), plus a NEW delivery for each
// subscription elsewhere that it owes now and did not (registered since).
// It sets it.owed and it.registry to reg's. The subscriptions that
// delivered it here are not run again: only the new ones get it.
func rewrites(it *item, writes []driver.DeliveryWrite, reg *registry) []driver.DeliveryWrite {
	now := reg.owedElsewhere(it.env.Type)
	out := make([]driver.DeliveryWrite, 0, len(writes)+len(now))
	for _, w := range writes {
		if slices.Contains(it.owed, w.Subscription) && !slices.Contains(now, w.Subscription) {
			continue
		}
		out = append(out, w)
	}
	for _, name := range now {
		if !slices.ContainsFunc(out, func(w driver.DeliveryWrite) bool { return w.Subscription == name }) {
			out = append(out, driver.DeliveryWrite{Subscription: name, Status: driver.StatusNew})
		}
	}
	it.owed, it.registry = now, reg.version
	return out
}

// resplit records its, whole events delivered to every subscription here
// whose DONE the store refused because the registry moved past version
// and under the new one they owe other subscriptions too, as split
// events: a NEW delivery for each subscription elsewhere they owe now
// (rewrites), in one Split with the new version. What Split cannot
// record (the registry moved again, the lease is lost, an error) is
// handed back (registryChanged).
func (c *completer) resplit(ctx context.Context, version int64, its []*item) {
	if err := c.reg.syncIfOlder(ctx, version); err != nil {
		c.handBack(version, its)
		return
	}
	reg := c.reg.load()
	var back, split []*item
	var splits []driver.EventSplit
	for _, it := range its {
		writes := rewrites(it, nil, reg) // it.registry is reg.version now
		if len(writes) == 0 {
			back = append(back, it) // owes nothing elsewhere again: rare, delivered anew
			continue
		}
		split = append(split, it)
		splits = append(splits, driver.EventSplit{EventID: it.env.ID, Writes: writes})
	}
	if len(splits) > 0 {
		held, err := retryStore(ctx, func() ([]bool, error) {
			return c.dstore.Split(ctx, c.owner, splits, reg.version)
		})
		for i, it := range split {
			if err != nil || i >= len(held) || !held[i] {
				back = append(back, it)
				continue
			}
			c.leases.letGo(it.key())
			c.sig.next(it)
		}
	}
	if len(back) > 0 {
		c.handBack(version, back)
	}
}

// registryChanged takes its, whole events delivered here whose completing
// write the store refused because the registry moved past version (and
// whose owed subscriptions changed with it), out of this instance's
// hands: it learns the registry again if recheck has not, then gives the
// events back, due at once and with
// no attempt counted, for a claim (here or elsewhere) to deliver them
// again with the subscriptions they owe now. The events of their keys
// that waited behind them here are given back too.
func (d *dispatcher) registryChanged(ctx context.Context, version int64, its []*item) {
	if len(its) == 0 {
		return
	}
	if err := d.reg.syncIfOlder(ctx, version); err != nil {
		d.log.Error("learn the subscriptions again after a completion refused for a stale registry; the next refresh will", slog.Any("error", err))
	}
	d.log.Warn("a subscription was registered after these events' subscriptions were decided: handed back to be delivered again (a duplicate for the subscriptions that had them)",
		slog.Int("events", len(its)), slog.Int64("registry_version", version))
	for _, it := range its {
		d.chainFailed(ctx, it)
		d.giveBack(it.env.OrderingKey, it)
	}
}
