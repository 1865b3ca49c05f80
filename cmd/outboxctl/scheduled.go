package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// scheduledJSON is one event not due yet, as scheduled list -json prints
// it.
type scheduledJSON struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	OrderingKey   string    `json:"ordering_key,omitempty"`
	Due           time.Time `json:"due"`
}

// scheduledList lists the events not due yet, earliest first.
func (c *cli) scheduledList(args []string) error {
	fs := c.flags("scheduled list")
	limit := fs.Int("limit", 100, "the most events to list (0: all)")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		var all []scheduledJSON
		var after outbox.ScheduledEvent
		for {
			n := 500
			if *limit > 0 {
				n = min(500, *limit-len(all))
			}
			page, err := s.Scheduled(c.ctx, after.Due, after.ID, n)
			if err != nil {
				return err
			}
			for _, e := range page {
				all = append(all, scheduledJSON{e.ID, e.Type, e.AggregateType, e.AggregateID, e.OrderingKey, e.Due.UTC()})
			}
			if len(page) < n || (*limit > 0 && len(all) >= *limit) {
				break
			}
			after = page[len(page)-1]
		}
		return c.out(map[string]any{"scheduled": all}, func(w *tabwriter.Writer) {
			if len(all) == 0 {
				none(w, "scheduled events")
				return
			}
			fmt.Fprintln(w, "ID\tTYPE\tAGGREGATE\tKEY\tDUE\tIN")
			for _, e := range all {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", esc(e.ID), esc(e.Type), esc(aggregate(e.AggregateType, e.AggregateID)), esc(orDash(e.OrderingKey)),
					e.Due.Format(time.RFC3339), time.Until(e.Due).Round(time.Second))
			}
		})
	})
}

// scheduledCancel cancels events before they are due.
func (c *cli) scheduledCancel(args []string) error {
	fs := c.flags("scheduled cancel")
	yes := fs.Bool("yes", false, "really cancel; without it, name them only and exit 3")
	return c.withStore(fs, args, func(n int) bool { return n > 0 }, func(s *sqlstore.Store, ids []string) error {
		type result struct {
			ID        string `json:"id"`
			Cancelled bool   `json:"cancelled"`
			Why       string `json:"why,omitempty"`
		}
		var out []result
		cancelled := 0
		for _, id := range ids {
			if !*yes {
				out = append(out, result{ID: id})
				continue
			}
			ok, err := s.Cancel(c.ctx, id)
			r := result{ID: id, Cancelled: ok}
			switch {
			case errors.Is(err, outbox.ErrNotFound):
				r.Why = "no such event"
			case errors.Is(err, outbox.ErrOrderedNotCancellable):
				r.Why = "ordered: the later events of its key wait behind it"
			case err != nil:
				return fmt.Errorf("cancel %s: %w", id, err)
			case !ok:
				r.Why = "due already, being delivered, or done"
			}
			if ok {
				cancelled++
			}
			out = append(out, r)
		}
		if err := c.out(map[string]any{"dry_run": !*yes, "cancelled": cancelled, "events": out}, func(w *tabwriter.Writer) {
			if !*yes {
				fmt.Fprintf(w, "would cancel %d events if not due yet (add -yes to cancel them)\n", len(ids))
				return
			}
			fmt.Fprintf(w, "cancelled %d of %d events\n", cancelled, len(ids))
			for _, r := range out {
				if !r.Cancelled {
					fmt.Fprintf(w, "%s\tnot cancelled: %s\n", esc(r.ID), r.Why)
				}
			}
		}); err != nil {
			return err
		}
		if !*yes {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}
