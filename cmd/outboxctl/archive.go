package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// archivedJSON is one archived event, as archive search -json prints it.
type archivedJSON struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	TenantID      string    `json:"tenant_id,omitempty"`
	OrderingKey   string    `json:"ordering_key,omitempty"`
	Attempts      int       `json:"attempts"`
	CreatedAt     time.Time `json:"created_at"`
	DeliveredAt   time.Time `json:"delivered_at"`
	DeliveredBy   string    `json:"delivered_by"`
}

// archiveSearch lists archived events by id, type or aggregate, in id
// order (sqlstore's Options.ArchiveDelivered).
func (c *cli) archiveSearch(args []string) error {
	fs := c.flags("archive search")
	id := fs.String("id", "", "one event's id")
	typ := fs.String("type", "", "an event type")
	agg := fs.String("aggregate", "", "an aggregate: TYPE/ID, or TYPE for every aggregate of the type")
	after := fs.String("after", "", "the last id of the previous page")
	limit := fs.Int("limit", 100, fmt.Sprintf("the most events to list (1 to %d)", sqlstore.MaxArchiveSearchLimit))
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		if *limit < 1 || *limit > sqlstore.MaxArchiveSearchLimit {
			return usageErr("archive search: -limit %d; it must be 1 to %d", *limit, sqlstore.MaxArchiveSearchLimit)
		}
		q := outbox.ArchiveQuery{ID: *id, Type: *typ, After: *after, Limit: *limit}
		q.AggregateType, q.AggregateID, _ = strings.Cut(*agg, "/")
		page, err := s.SearchArchive(c.ctx, q)
		if err != nil {
			return err
		}
		all := make([]archivedJSON, 0, len(page))
		for _, e := range page {
			all = append(all, archivedJSON{e.ID, e.Type, e.AggregateType, e.AggregateID, e.TenantID, e.OrderingKey, e.Attempts, e.CreatedAt.UTC(), e.DeliveredAt.UTC(), e.DeliveredBy})
		}
		return c.out(map[string]any{"archived": all}, func(w *tabwriter.Writer) {
			if len(all) == 0 {
				none(w, "archived events")
				return
			}
			fmt.Fprintln(w, "ID\tTYPE\tAGGREGATE\tATTEMPTS\tDELIVERED\tBY")
			for _, e := range all {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", esc(e.ID), esc(e.Type), esc(aggregate(e.AggregateType, e.AggregateID)), e.Attempts,
					e.DeliveredAt.Format(time.RFC3339), esc(e.DeliveredBy))
			}
			if len(all) == *limit {
				fmt.Fprintf(w, "more: -after %s\n", esc(all[len(all)-1].ID))
			}
		})
	})
}

// archiveShow prints one event, archived or not, with when and by whom
// it was delivered if archived.
func (c *cli) archiveShow(args []string) error {
	fs := c.flags("archive show")
	withPayload := fs.Bool("payload", false, "print the payload too (it may hold personal data)")
	return c.withStore(fs, args, exactly(1), func(s *sqlstore.Store, args []string) error {
		r, err := s.Inspect(c.ctx, args[0])
		if errors.Is(err, outbox.ErrNotFound) {
			return nothing("no event %q", args[0])
		}
		if err != nil {
			return err
		}
		v := recordView(r, *withPayload)
		return c.out(v, func(w *tabwriter.Writer) { c.printRecord(w, v) })
	})
}

// archiveCleanup deletes archived events delivered more than -older ago,
// in batches of -limit.
func (c *cli) archiveCleanup(args []string) error {
	fs := c.flags("archive cleanup")
	older := fs.Duration("older", 30*24*time.Hour, "delete archived events delivered more than this long ago")
	limit := fs.Int("limit", 1000, "rows per DELETE")
	yes := fs.Bool("yes", false, "really delete; without it, exit 3")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		if *older <= 0 || *limit <= 0 {
			return usageErr("archive cleanup: -older and -limit must be positive")
		}
		if !*yes {
			if err := c.out(map[string]any{"dry_run": true}, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "would delete the archived events delivered more than %v ago (add -yes to delete them)\n", *older)
			}); err != nil {
				return err
			}
			return &exitErr{code: exitNothing}
		}
		var total int64
		for {
			n, err := s.CleanupArchive(c.ctx, *older, *limit)
			total += n
			if err != nil {
				return fmt.Errorf("archive cleanup: deleted %d, then: %w", total, err)
			}
			if n < int64(*limit) {
				break
			}
		}
		return c.out(map[string]any{"deleted": total}, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "deleted %d archived events delivered more than %v ago\n", total, *older)
		})
	})
}
