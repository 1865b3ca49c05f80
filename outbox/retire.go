package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The end of a subscription's life. A subscription is owed every event
// committed from its registration on, until it is retired: explicitly
// (Retire), or once no instance has registered it for
// Config.SubscriptionExpiry (an instance that runs the registry refresh
// retires it then). Retiring it settles what it owed: its NEW and RETRY
// deliveries are dropped and counted, the events they held back become
// DONE, and its dead deliveries stay as dead letters until purged.

// ErrSubscriptionLive is returned (wrapped) by Retire for a subscription
// that an instance still runs.
var ErrSubscriptionLive = driver.ErrSubscriptionLive

// Retired is what Retire did: whether the registry knew the subscription,
// how many deliveries it owed were dropped, and how many events became
// DONE with them.
type Retired = driver.Retired

// Retire retires subscription name on every instance: it leaves the
// registry, and what it owed is settled (see Retired): its NEW and RETRY
// deliveries are dropped, the events that waited only for them become
// DONE, and its dead deliveries stay as dead letters. Retire is for a
// subscription that was removed from the code of every instance; it
// refuses one of this instance's own, and one that an instance registered
// less than RetireIdle ago (ErrSubscriptionLive): it is still running
// somewhere, and would register again. A name the registry does not know
// (Lag lists it as Unregistered) has its deliveries settled all the same.
// The store must implement driver.Retirer (sqlstore does).
func (o *Outbox) Retire(ctx context.Context, name string) (Retired, error) {
	rs, ok := o.store.(driver.Retirer)
	if !ok {
		return Retired{}, fmt.Errorf("outbox: Retire: the store (%T) does not implement driver.Retirer", o.store)
	}
	if o.reg.load().byName[name] != nil {
		return Retired{}, fmt.Errorf("outbox: Retire: subscription %q is one of this instance's: %w (remove its Subscribe call, deploy every instance without it, then retire it)", name, ErrSubscriptionLive)
	}
	r, err := rs.RetireSubscription(ctx, name, o.cfg.retireIdle())
	if err != nil {
		return r, err
	}
	o.reg.retired(name, r, "retired")
	if err := o.reg.sync(ctx); err != nil {
		o.log.Warn("learn the subscriptions after a retirement; the next refresh will", slog.Any("error", err))
	}
	return r, nil
}

// RetireIdle is how long no instance must have registered a subscription
// before Retire takes it: three refreshes of the registry at this
// instance's PollInterval, at least a minute, at most SubscriptionExpiry.
func (o *Outbox) RetireIdle() time.Duration { return o.cfg.retireIdle() }

func (c *Config) retireIdle() time.Duration {
	return min(c.SubscriptionExpiry, max(3*c.PollInterval, time.Minute))
}

// retireExpired retires the subscriptions that no instance has registered
// for SubscriptionExpiry (expired in the last refresh).
func (g *registrar) retireExpired(ctx context.Context) {
	rs, ok := g.store.(driver.Retirer)
	cur := g.load()
	if !ok || len(cur.expired) == 0 {
		return
	}
	for _, name := range cur.expired {
		r, err := rs.RetireSubscription(ctx, name, g.cfg.SubscriptionExpiry)
		switch {
		case errors.Is(err, driver.ErrSubscriptionLive):
			continue // registered again meanwhile
		case err != nil:
			if ctx.Err() == nil {
				g.log.Error("retire an expired subscription; the next refresh tries again", slog.String("subscription", name), slog.Any("error", err))
			}
			return
		}
		g.retired(name, r, fmt.Sprintf("expired: no instance registered it for %s (SubscriptionExpiry)", g.cfg.SubscriptionExpiry))
	}
	if err := g.sync(ctx); err != nil && ctx.Err() == nil {
		g.log.Error("refresh the subscriptions from the database", slog.Any("error", err))
	}
}

// retired logs what retiring a subscription settled.
func (g *registrar) retired(name string, r Retired, why string) {
	if !r.Registered && r.Dropped == 0 {
		return
	}
	g.log.Warn("subscription retired: what it still owed was dropped",
		slog.String("subscription", name), slog.String("reason", why),
		slog.Int64("deliveries_dropped", r.Dropped), slog.Int64("events_completed", r.Completed))
}

// expiredOf returns the names of reg's subscriptions that no instance has
// registered for expiry, none of them local.
func expiredOf(reg driver.Registration, local map[string]*subscription, expiry time.Duration) []string {
	var out []string
	for _, st := range reg.Subscriptions {
		if st.Idle > expiry && local[st.Name] == nil {
			out = append(out, st.Name)
		}
	}
	slices.Sort(out)
	return out
}
