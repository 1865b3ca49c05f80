package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/internal/dsn"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

type cli struct {
	out   io.Writer
	json  bool
	db    *sqlx.DB
	store *sqlstore.Store
}

func (c *cli) open(ctx context.Context, s, table string) error {
	d, err := dsn.Parse(s, "")
	if err != nil {
		return fmt.Errorf("%w (set -dsn or DATABASE_URL)", err)
	}
	db, err := sqlx.Open(d.Driver, d.DSN)
	if err != nil {
		return fmt.Errorf("open %s: %w", d.Display, err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return fmt.Errorf("connect to %s: %w", d.Display, err)
	}
	st, err := sqlstore.New(db, sqlstore.Options{Table: table})
	if err != nil {
		db.Close()
		return err
	}
	c.db, c.store = db, st
	return nil
}

func (c *cli) close() { c.db.Close() }

func (c *cli) dispatch(ctx context.Context, args []string) error {
	switch args[0] {
	case "migrate":
		if len(args) != 2 || (args[1] != "up" && args[1] != "status") {
			return &usageError{"migrate takes up or status"}
		}
		if args[1] == "up" {
			return c.migrateUp(ctx)
		}
		return c.migrateStatus(ctx)
	case "stats":
		return c.stats(ctx)
	case "dead":
		if len(args) < 2 {
			return &usageError{"dead takes list, show or replay"}
		}
		switch args[1] {
		case "list":
			return c.deadList(ctx, args[2:])
		case "show":
			return c.deadShow(ctx, args[2:])
		case "replay":
			return c.deadReplay(ctx, args[2:])
		}
		return &usageError{fmt.Sprintf("dead %s: unknown; want list, show or replay", args[1])}
	case "pause", "resume":
		if len(args) != 2 {
			return &usageError{args[0] + " takes one subscription name"}
		}
		return c.pause(ctx, args[1], args[0] == "pause")
	case "cleanup":
		return c.cleanup(ctx, args[1:])
	}
	return &usageError{fmt.Sprintf("unknown command %q", args[0])}
}

// print writes v as JSON, or calls text with an aligned writer.
func (c *cli) print(v any, text func(w io.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	text(tw)
	return tw.Flush()
}

func (c *cli) migrateUp(ctx context.Context) error {
	if err := c.store.Migrate(ctx); err != nil {
		return err
	}
	return c.migrateStatus(ctx)
}

type migration struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

func (c *cli) migrateStatus(ctx context.Context) error {
	steps, err := c.store.Migrations()
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	var versions []int
	if err := c.db.SelectContext(ctx, &versions, `SELECT version FROM `+c.store.SchemaTable()); err == nil {
		for _, v := range versions {
			applied[v] = true
		}
	}
	out := make([]migration, len(steps))
	for i, m := range steps {
		out[i] = migration{Version: m.Version, Name: m.Name, Applied: applied[m.Version]}
	}
	return c.print(out, func(w io.Writer) {
		fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED")
		for _, m := range out {
			fmt.Fprintf(w, "%03d\t%s\t%v\n", m.Version, m.Name, m.Applied)
		}
	})
}

type statsDoc struct {
	Events struct {
		New, Retry, Split, Done, Dead, Unknown int64
		OldestPendingSeconds                   float64
	} `json:"events"`
	Subscriptions []subDoc `json:"subscriptions"`
}

type subDoc struct {
	Name          string   `json:"name"`
	Types         []string `json:"types,omitempty"`
	Paused        bool     `json:"paused"`
	IdleSeconds   float64  `json:"idle_seconds"`
	Pending       int64    `json:"pending"`
	Retrying      int64    `json:"retrying"`
	Dead          int64    `json:"dead"`
	OldestSeconds float64  `json:"oldest_seconds"`
}

func (c *cli) stats(ctx context.Context) error {
	st, err := c.store.Stats(ctx)
	if err != nil {
		return err
	}
	var doc statsDoc
	doc.Events.New, doc.Events.Retry, doc.Events.Split, doc.Events.Done, doc.Events.Dead, doc.Events.Unknown = st.New, st.Retry, st.Split, st.Done, st.Dead, st.Unknown
	doc.Events.OldestPendingSeconds = st.OldestPending.Seconds()
	// Registering nothing returns what is registered.
	subs, err := c.store.SyncSubscriptions(ctx, nil)
	if err != nil {
		return err
	}
	infos := make([]outbox.SubscriptionInfo, len(subs))
	for i, s := range subs {
		infos[i] = s.SubscriptionInfo
	}
	lags, err := c.store.Lag(ctx, infos)
	if err != nil {
		return err
	}
	doc.Subscriptions = []subDoc{}
	for i, s := range subs {
		d := subDoc{Name: s.Name, Paused: s.Paused, IdleSeconds: s.Idle.Seconds(),
			Pending: lags[i].Pending, Retrying: lags[i].Retrying, Dead: lags[i].Dead, OldestSeconds: lags[i].Oldest.Seconds()}
		for _, t := range s.Types {
			d.Types = append(d.Types, string(t))
		}
		doc.Subscriptions = append(doc.Subscriptions, d)
	}
	return c.print(doc, func(w io.Writer) {
		e := doc.Events
		fmt.Fprintln(w, "EVENTS\tNEW\tRETRY\tSPLIT\tDONE\tDEAD\tUNKNOWN\tOLDEST PENDING")
		fmt.Fprintf(w, "\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", e.New, e.Retry, e.Split, e.Done, e.Dead, e.Unknown, secs(e.OldestPendingSeconds))
		fmt.Fprintln(w)
		fmt.Fprintln(w, "SUBSCRIPTION\tTYPES\tPAUSED\tPENDING\tRETRYING\tDEAD\tOLDEST\tLAST SEEN")
		for _, s := range doc.Subscriptions {
			types := strings.Join(s.Types, ",")
			if types == "" {
				types = "*"
			}
			fmt.Fprintf(w, "%s\t%s\t%v\t%d\t%d\t%d\t%s\t%s ago\n", s.Name, types, s.Paused, s.Pending, s.Retrying, s.Dead, secs(s.OldestSeconds), secs(s.IdleSeconds))
		}
	})
}

func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}

// filterFlags parses the dead-letter filters of args.
func filterFlags(name string, args []string, extra func(fs *flag.FlagSet)) (outbox.DeadFilter, *flag.FlagSet, error) {
	var f outbox.DeadFilter
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.Subscription, "subscription", "", "only this subscription's dead deliveries")
	typ := fs.String("type", "", "only this event type")
	since := fs.String("since", "", "only events created at or after (RFC 3339)")
	until := fs.String("until", "", "only events created before (RFC 3339)")
	fs.StringVar(&f.ErrorContains, "error", "", "only dead letters whose last error contains this")
	fs.IntVar(&f.Limit, "limit", 100, "the most to list")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return f, fs, &usageError{fmt.Sprintf("%s: %v", name, err)}
	}
	f.Type = outbox.EventType(*typ)
	for _, t := range []struct {
		s   string
		dst *time.Time
	}{{*since, &f.Since}, {*until, &f.Until}} {
		if t.s == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.s)
		if err != nil {
			return f, fs, &usageError{fmt.Sprintf("%s: %q is not an RFC 3339 time (2026-11-23T10:00:00Z)", name, t.s)}
		}
		*t.dst = v
	}
	return f, fs, nil
}

type deadDoc struct {
	ID           string    `json:"id"`
	Subscription string    `json:"subscription,omitempty"`
	Type         string    `json:"type"`
	Aggregate    string    `json:"aggregate,omitempty"`
	Attempts     int       `json:"attempts"`
	LastError    string    `json:"last_error"`
	CreatedAt    time.Time `json:"created_at"`
}

func toDeadDocs(dls []outbox.DeadLetter) []deadDoc {
	out := make([]deadDoc, 0, len(dls))
	for _, dl := range dls {
		agg := ""
		if dl.AggregateType != "" || dl.AggregateID != "" {
			agg = dl.AggregateType + "/" + dl.AggregateID
		}
		out = append(out, deadDoc{ID: dl.ID, Subscription: dl.Subscription, Type: dl.Type, Aggregate: agg,
			Attempts: dl.Attempts, LastError: dl.LastError, CreatedAt: dl.CreatedAt.UTC()})
	}
	return out
}

func (c *cli) deadList(ctx context.Context, args []string) error {
	f, _, err := filterFlags("dead list", args, nil)
	if err != nil {
		return err
	}
	dls, err := c.store.FindDead(ctx, f)
	if err != nil {
		return err
	}
	docs := toDeadDocs(dls)
	return c.print(docs, func(w io.Writer) {
		fmt.Fprintln(w, "ID\tSUBSCRIPTION\tTYPE\tAGGREGATE\tATTEMPTS\tCREATED\tLAST ERROR")
		for _, d := range docs {
			sub := d.Subscription
			if sub == "" {
				sub = "(event)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.ID, sub, d.Type, d.Aggregate, d.Attempts, d.CreatedAt.Format(time.RFC3339), oneLine(d.LastError, 80))
		}
	})
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

type showDoc struct {
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	Status     string          `json:"status"`
	Attempts   int             `json:"attempts"`
	LastError  string          `json:"last_error,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	Deliveries []deliveryDoc   `json:"deliveries"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	PayloadB   []byte          `json:"payload_bytes,omitempty"`
}

type deliveryDoc struct {
	Subscription string       `json:"subscription"`
	Status       string       `json:"status"`
	Attempts     int          `json:"attempts"`
	LastError    string       `json:"last_error,omitempty"`
	History      []attemptDoc `json:"history,omitempty"`
}

type attemptDoc struct {
	N     int       `json:"n"`
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

func (c *cli) deadShow(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dead show", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	payload := fs.Bool("payload", false, "include the payload (it may hold personal data)")
	// The id may come before or after the flag.
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return &usageError{"dead show: " + err.Error()}
	}
	if id == "" && fs.NArg() == 1 {
		id = fs.Arg(0)
	}
	if id == "" {
		return &usageError{"dead show takes an event id"}
	}
	rec, err := c.store.Inspect(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return fmt.Errorf("event %s: %w", id, errNoMatch)
	}
	if err != nil {
		return err
	}
	doc := showDoc{ID: rec.ID, Type: rec.Type, Status: rec.Status.String(), Attempts: rec.Attempts, LastError: rec.LastError,
		CreatedAt: rec.CreatedAt.UTC(), Deliveries: []deliveryDoc{}}
	for _, d := range rec.Deliveries {
		dd := deliveryDoc{Subscription: d.Subscription, Status: d.Status.String(), Attempts: d.Attempts, LastError: d.LastError}
		for _, a := range d.History {
			dd.History = append(dd.History, attemptDoc{N: a.N, At: a.At.UTC(), Error: a.Error})
		}
		doc.Deliveries = append(doc.Deliveries, dd)
	}
	if *payload {
		if rec.PayloadJSON {
			doc.Payload = rec.Payload
		} else {
			doc.PayloadB = rec.Payload
		}
	}
	return c.print(doc, func(w io.Writer) {
		fmt.Fprintf(w, "id\t%s\ntype\t%s\nstatus\t%s\nattempts\t%d\ncreated\t%s\n", doc.ID, doc.Type, doc.Status, doc.Attempts, doc.CreatedAt.Format(time.RFC3339))
		if doc.LastError != "" {
			fmt.Fprintf(w, "last error\t%s\n", oneLine(doc.LastError, 200))
		}
		for _, d := range doc.Deliveries {
			fmt.Fprintf(w, "delivery %s\t%s, %d attempts\n", d.Subscription, d.Status, d.Attempts)
			for _, a := range d.History {
				fmt.Fprintf(w, "  attempt %d\t%s\t%s\n", a.N, a.At.Format(time.RFC3339), oneLine(a.Error, 160))
			}
		}
		switch {
		case doc.Payload != nil:
			fmt.Fprintf(w, "payload\t%s\n", doc.Payload)
		case doc.PayloadB != nil:
			fmt.Fprintf(w, "payload\t%d bytes (binary)\n", len(doc.PayloadB))
		default:
			fmt.Fprintln(w, "payload\t(hidden; -payload shows it)")
		}
	})
}

type replayDoc struct {
	DryRun   bool     `json:"dry_run"`
	Count    int      `json:"count"`
	FirstIDs []string `json:"first_ids,omitempty"`
}

func (c *cli) deadReplay(ctx context.Context, args []string) error {
	var ids string
	var dry bool
	var rate float64
	f, _, err := filterFlags("dead replay", args, func(fs *flag.FlagSet) {
		fs.StringVar(&ids, "ids", "", "comma-separated event ids (all their dead deliveries)")
		fs.BoolVar(&dry, "dry-run", false, "count and show the first ids; change nothing")
		fs.Float64Var(&rate, "rate", 0, "replay at most this many per second (0: no limit)")
	})
	if err != nil {
		return err
	}
	doc := replayDoc{DryRun: dry}
	if ids != "" {
		list := strings.Split(ids, ",")
		if dry {
			doc.Count, doc.FirstIDs = len(list), first(list, 10)
		} else {
			if doc.Count, err = c.store.Replay(ctx, list); err != nil {
				return err
			}
			doc.FirstIDs = first(list, 10)
		}
	} else {
		page, err := c.store.FindDead(ctx, outbox.DeadFilter{Subscription: f.Subscription, Type: f.Type, Since: f.Since, Until: f.Until, ErrorContains: f.ErrorContains, Limit: 10})
		if err != nil {
			return err
		}
		for _, dl := range page {
			doc.FirstIDs = append(doc.FirstIDs, dl.ID)
		}
		f.Limit = 0
		if dry || rate <= 0 {
			if doc.Count, err = c.store.ReplayDead(ctx, f, dry); err != nil {
				return err
			}
		} else {
			// Rate-limited: pages of at most rate events, one a second.
			f.Limit = max(1, int(rate))
			for {
				page, err := c.store.FindDead(ctx, f)
				if err != nil || len(page) == 0 {
					if err != nil {
						return err
					}
					break
				}
				var ids []string
				for _, dl := range page {
					ids = append(ids, dl.ID)
				}
				n, err := c.store.Replay(ctx, ids)
				doc.Count += n
				if err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Second):
				}
			}
		}
	}
	if err := c.print(doc, func(w io.Writer) {
		verb := "replayed"
		if dry {
			verb = "would replay"
		}
		fmt.Fprintf(w, "%s %d dead letters\n", verb, doc.Count)
		for _, id := range doc.FirstIDs {
			fmt.Fprintf(w, "  %s\n", id)
		}
	}); err != nil {
		return err
	}
	if doc.Count == 0 {
		return fmt.Errorf("replay: %w", errNoMatch)
	}
	return nil
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

func (c *cli) pause(ctx context.Context, name string, paused bool) error {
	known, err := c.store.SetPaused(ctx, name, paused)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("no subscription named %q is registered: %w", name, errNoMatch)
	}
	state := map[bool]string{true: "paused", false: "resumed"}[paused]
	return c.print(map[string]any{"subscription": name, "paused": paused}, func(w io.Writer) {
		fmt.Fprintf(w, "%s %s (every instance obeys within its poll interval)\n", name, state)
	})
}

func (c *cli) cleanup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	older := fs.Duration("older-than", 0, "delete events delivered more than this long ago (database clock), e.g. 168h")
	dead := fs.Bool("dead", false, "delete dead letters older than that too")
	confirm := fs.Bool("confirm", false, "really delete (without it, nothing is deleted)")
	if err := fs.Parse(args); err != nil {
		return &usageError{"cleanup: " + err.Error()}
	}
	if *older <= 0 {
		return &usageError{"cleanup needs -older-than (e.g. -older-than 168h)"}
	}
	if !*confirm {
		return fmt.Errorf("cleanup deletes rows: add -confirm to go ahead: %w", errNoMatch)
	}
	var total int64
	for {
		n, err := c.store.Cleanup(ctx, *older, 1000, *dead)
		total += n
		if err != nil {
			return err
		}
		if n < 1000 {
			break
		}
	}
	return c.print(map[string]any{"deleted": total}, func(w io.Writer) {
		fmt.Fprintf(w, "deleted %d events\n", total)
	})
}
