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
// and hands the events back to be delivered anew: a duplicate for the
// subscriptions that had them (at least once), nothing lost for the new
// one. An event whose owed set the new registry leaves as it was (the
// new subscription does not take its type) is not handed back: its write
// is made again with the new version (recheck).

// fenced reports whether err is the store's refusal of a completing
// write made with a stale registry.
func fenced(err error) bool { return errors.Is(err, driver.ErrRegistryChanged) }

// registryFence is what the completer needs of the dispatcher when the
// store refuses a batch's DONE for a stale registry.
type registryFence interface {
	recheck(ctx context.Context, version int64, its []*item) []*item
	registryChanged(ctx context.Context, version int64, its []*item)
}

// recheck learns the registry again after the store refused the
// completing write of its, whose subscriptions were decided by the
// registry of version, and returns those of its that owe the same
// subscriptions elsewhere under the new registry, their item.registry set
// to its version: their write can be made again as it was. The others
// must be delivered again (registryChanged).
func (d *dispatcher) recheck(ctx context.Context, version int64, its []*item) []*item {
	if err := d.reg.syncIfOlder(ctx, version); err != nil {
		d.log.Error("learn the subscriptions again after a completion refused for a stale registry; the next refresh will", slog.Any("error", err))
		return nil
	}
	reg := d.reg.load()
	var same []*item
	for _, it := range its {
		if reg.version != version && slices.Equal(it.owed, reg.owedElsewhere(it.env.Type)) {
			it.registry = reg.version
			same = append(same, it)
		}
	}
	return same
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
