package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// retireJSON is the output of retire.
type retireJSON struct {
	Subscription string `json:"subscription"`
	// Retired is false for a count without -yes.
	Retired    bool  `json:"retired"`
	Registered bool  `json:"registered"`
	Pending    int64 `json:"pending_deliveries"`
	Retrying   int64 `json:"retrying_deliveries"`
	Dead       int64 `json:"dead_deliveries"`
	Dropped    int64 `json:"dropped,omitempty"`
	Completed  int64 `json:"events_completed,omitempty"`
}

// retire retires a subscription that no instance runs any more (see
// outbox.Outbox.Retire): without -yes it counts what it owes and exits 3.
func (c *cli) retire(args []string) error {
	fs := c.flags("retire")
	yes := fs.Bool("yes", false, "really retire it; without it, count what it owes and exit 3")
	idle := fs.Duration("idle", time.Minute, "refuse if an instance registered the subscription less than this long ago (instances register theirs every PollInterval)")
	return c.withStore(fs, args, exactly(1), func(s *sqlstore.Store, args []string) error {
		if *idle < 0 {
			return usageErr("retire: -idle must not be negative")
		}
		name := args[0]
		v := retireJSON{Subscription: name}
		if err := c.owed(s, &v); err != nil {
			return err
		}
		if !v.Registered && v.Pending+v.Retrying+v.Dead == 0 {
			return nothing("no subscription %q is registered or holds deliveries", name)
		}
		if *yes {
			r, err := s.RetireSubscription(c.ctx, name, *idle)
			if errors.Is(err, driver.ErrSubscriptionLive) {
				return fmt.Errorf("%w\n(an instance still runs %q: remove it from every instance's code and deploy, then retire it)", err, name)
			}
			if err != nil {
				return err
			}
			v.Retired, v.Dropped, v.Completed = true, r.Dropped, r.Completed
		}
		if err := c.out(v, func(w *tabwriter.Writer) { retireText(w, v) }); err != nil {
			return err
		}
		if !*yes {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

// owed fills in whether v's subscription is registered and the deliveries
// it holds.
func (c *cli) owed(s *sqlstore.Store, v *retireJSON) error {
	subs, err := s.Subscriptions(c.ctx)
	if err != nil {
		return err
	}
	for _, sub := range subs {
		v.Registered = v.Registered || sub.Name == v.Subscription
	}
	// Asked about no subscription, Lag reports every one that holds
	// deliveries, from its deliveries alone.
	lags, err := s.Lag(c.ctx, nil)
	if err != nil {
		return err
	}
	for _, l := range lags {
		if l.Subscription == v.Subscription {
			v.Pending, v.Retrying, v.Dead = l.Pending, l.Retrying, l.Dead
		}
	}
	return nil
}

func retireText(w *tabwriter.Writer, v retireJSON) {
	if !v.Retired {
		fmt.Fprintf(w, "would retire %s (registered: %s): drop %d pending and %d retrying deliveries; %d dead ones stay as dead letters (add -yes to retire it)\n",
			v.Subscription, yesNo(v.Registered), v.Pending, v.Retrying, v.Dead)
		return
	}
	fmt.Fprintf(w, "retired %s: %d deliveries dropped, %d events completed; %d dead deliveries stay as dead letters\n",
		v.Subscription, v.Dropped, v.Completed, v.Dead)
}
