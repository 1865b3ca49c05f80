package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// --- inbox: the parked messages of package inbox

type parkedJSON struct {
	Consumer   string            `json:"consumer"`
	ID         string            `json:"id"`
	ParkedAt   time.Time         `json:"parked_at"`
	Attempts   int               `json:"attempts"`
	LastError  string            `json:"last_error"`
	Headers    map[string]string `json:"headers,omitempty"`
	Payload    *string           `json:"payload,omitempty"`
	PayloadLen int               `json:"payload_bytes"`
}

// withInbox runs f on an Inbox over the store's database and table.
func (c *cli) withInbox(fs *flag.FlagSet, args []string, nargs func(int) bool, f func(ib *inbox.Inbox, args []string) error) error {
	return c.withStore(fs, args, nargs, func(s *sqlstore.Store, args []string) error {
		d, err := inbox.DialectNamed(s.Dialect().Name())
		if err != nil {
			return err
		}
		ib, err := inbox.New(s.DB().DB, inbox.Config{Dialect: d, Table: cmp.Or(c.table, sqlstore.DefaultTable)})
		if err != nil {
			return usageErr("%v", err)
		}
		return f(ib, args)
	})
}

func parked(e inbox.Entry, withPayload bool) parkedJSON {
	v := parkedJSON{Consumer: e.Consumer, ID: e.Message.ID, ParkedAt: e.ReceivedAt, Attempts: e.Attempts, LastError: e.LastError,
		Headers: e.Message.Headers, PayloadLen: len(e.Message.Payload)}
	if withPayload {
		p := string(e.Message.Payload)
		if !utf8.Valid(e.Message.Payload) {
			p = fmt.Sprintf("%q", e.Message.Payload)
		}
		v.Payload = &p
	}
	return v
}

func (c *cli) inboxList(args []string) error {
	fs := c.flags("inbox list")
	consumer := fs.String("consumer", "", "only this consumer's messages")
	limit := fs.Int("limit", 100, "at most this many")
	return c.withInbox(fs, args, exactly(0), func(ib *inbox.Inbox, _ []string) error {
		if *limit <= 0 {
			return usageErr("-limit %d: want > 0", *limit)
		}
		var all []parkedJSON
		f := inbox.ParkedFilter{Consumer: *consumer, Limit: min(500, *limit)}
		for len(all) < *limit {
			page, err := ib.Parked(c.ctx, f)
			if err != nil {
				return err
			}
			for _, e := range page {
				all = append(all, parked(e, false))
			}
			if len(page) < f.Limit {
				break
			}
			last := page[len(page)-1]
			f.AfterConsumer, f.AfterID, f.Limit = last.Consumer, last.Message.ID, min(500, *limit-len(all))
		}
		if len(all) == 0 {
			if c.json {
				if err := c.out([]parkedJSON{}, nil); err != nil {
					return err
				}
			}
			return nothing("no parked messages")
		}
		return c.out(all, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "CONSUMER\tID\tPARKED\tATTEMPTS\tBYTES\tLAST ERROR")
			for _, v := range all {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", v.Consumer, v.ID, v.ParkedAt.Format(time.RFC3339), v.Attempts, v.PayloadLen, oneLine(v.LastError, 100))
			}
		})
	})
}

func (c *cli) inboxShow(args []string) error {
	fs := c.flags("inbox show")
	withPayload := fs.Bool("payload", false, "print the payload too (it may hold personal data)")
	return c.withInbox(fs, args, exactly(2), func(ib *inbox.Inbox, args []string) error {
		e, err := ib.Entry(c.ctx, args[0], args[1])
		if errors.Is(err, inbox.ErrNotParked) {
			return nothing("no parked message %q of consumer %q", args[1], args[0])
		}
		if err != nil {
			return err
		}
		v := parked(e, *withPayload)
		return c.out(v, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "consumer\t%s\n", v.Consumer)
			fmt.Fprintf(w, "id\t%s\n", v.ID)
			fmt.Fprintf(w, "parked\t%s\n", v.ParkedAt.Format(time.RFC3339))
			fmt.Fprintf(w, "attempts\t%d\n", v.Attempts)
			fmt.Fprintf(w, "last error\t%s\n", v.LastError)
			for k, h := range v.Headers {
				fmt.Fprintf(w, "header %s\t%s\n", k, h)
			}
			fmt.Fprintf(w, "payload\t%d bytes\n", v.PayloadLen)
			if v.Payload != nil {
				fmt.Fprintln(w, *v.Payload)
			}
		})
	})
}

func (c *cli) inboxPurge(args []string) error {
	fs := c.flags("inbox purge")
	yes := fs.Bool("yes", false, "really purge; without it, count only and exit 3")
	return c.withInbox(fs, args, func(n int) bool { return n >= 2 }, func(ib *inbox.Inbox, args []string) error {
		consumer, ids := args[0], args[1:]
		var v countJSON
		v.DryRun = !*yes
		if *yes {
			n, err := ib.Purge(c.ctx, consumer, ids...)
			v.Count = int(n)
			if err != nil {
				return fmt.Errorf("purged %d, then: %w", n, err)
			}
		} else {
			for _, id := range ids {
				if _, err := ib.Entry(c.ctx, consumer, id); err == nil {
					v.Count++
				} else if !errors.Is(err, inbox.ErrNotParked) {
					return err
				}
			}
		}
		if v.Count == 0 {
			return nothing("no parked messages matched")
		}
		if err := c.out(v, func(w *tabwriter.Writer) {
			if *yes {
				fmt.Fprintf(w, "purged %d parked messages (their ids still de-duplicate until the inbox cleanup)\n", v.Count)
				return
			}
			fmt.Fprintf(w, "would purge %d parked messages (add -yes to purge them)\n", v.Count)
		}); err != nil {
			return err
		}
		if !*yes {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

func (c *cli) inboxCleanup(args []string) error {
	fs := c.flags("inbox cleanup")
	retention := fs.Duration("retention", inbox.DefaultRetention, "delete the dedupe rows of messages received longer ago than this (the dedupe window)")
	limit := fs.Int("limit", inbox.DefaultCleanupBatch, "rows per delete")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		if *retention <= 0 || *limit <= 0 {
			return usageErr("-retention and -limit must be > 0")
		}
		d, err := inbox.DialectNamed(s.Dialect().Name())
		if err != nil {
			return err
		}
		ib, err := inbox.New(s.DB().DB, inbox.Config{Dialect: d, Table: cmp.Or(c.table, sqlstore.DefaultTable), Retention: *retention, CleanupBatch: *limit})
		if err != nil {
			return usageErr("%v", err)
		}
		n, err := ib.Cleanup(c.ctx)
		if err != nil {
			return fmt.Errorf("deleted %d, then: %w", n, err)
		}
		return c.out(countJSON{Count: int(n)}, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "deleted %d inbox rows\n", n)
		})
	})
}

func (c *cli) inboxCmd(sub func() (string, []string, error)) error {
	s, rest, err := sub()
	if err != nil {
		return err
	}
	switch s {
	case "list":
		return c.inboxList(rest)
	case "show":
		return c.inboxShow(rest)
	case "purge":
		return c.inboxPurge(rest)
	case "cleanup":
		return c.inboxCleanup(rest)
	}
	return usageErr("inbox %s: want list, show, purge or cleanup", s)
}
