package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/txoutbox/txoutbox/internal/dsn"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// redact takes the DSN's password out of err.
func (c *cli) redact(err error) error {
	var ee *exitErr
	if errors.As(err, &ee) {
		if r := dsn.Redact(errors.New(ee.msg), dsn.Password(c.dsnValue())); r != nil {
			return &exitErr{code: ee.code, msg: r.Error()}
		}
		return err
	}
	return dsn.Redact(err, dsn.Password(c.dsnValue()))
}

func (c *cli) dsnValue() string {
	if c.dsn != "" {
		return c.dsn
	}
	return c.env("DATABASE_URL")
}

// open opens the store. A SQLite file must exist: outboxctl never creates
// a database by mistake, except for migrate up.
func (c *cli) open(create bool) (*sqlstore.Store, func(), error) {
	d, err := dsn.Parse(c.dsnValue())
	if err != nil {
		if c.dsnValue() == "" {
			return nil, nil, usageErr("no database: give -dsn or set DATABASE_URL (%v)", dsn.ErrForm)
		}
		return nil, nil, usageErr("%v", err)
	}
	if d.Path != "" {
		if _, err := os.Stat(d.Path); err != nil {
			if !create {
				return nil, nil, fmt.Errorf("%s: %w", d.Display, err)
			}
			if err := os.MkdirAll(filepath.Dir(d.Path), 0o755); err != nil {
				return nil, nil, err
			}
		}
	}
	db, err := sqlx.Open(d.Driver, d.DSN)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", d.Display, err)
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	err = db.PingContext(ctx)
	cancel()
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("connect to %s: %w", d.Display, err)
	}
	s, err := sqlstore.New(db, sqlstore.Options{Table: c.table, AllowUnsupportedServer: c.anyServer})
	if err != nil {
		db.Close()
		return nil, nil, usageErr("%v", err)
	}
	return s, func() { db.Close() }, nil
}

// withStore parses a command's flags and runs f on the store.
func (c *cli) withStore(fs *flag.FlagSet, args []string, nargs func(int) bool, f func(s *sqlstore.Store, args []string) error) error {
	rest, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if nargs != nil && !nargs(len(rest)) {
		return usageErr("%s: wrong number of arguments", fs.Name())
	}
	s, closeDB, err := c.open(fs.Name() == "migrate up")
	if err != nil {
		return err
	}
	defer closeDB()
	err = f(s, rest)
	if !strings.HasPrefix(fs.Name(), "migrate") && s.IsMissingTable(err) {
		return c.notMigrated(err)
	}
	return err
}

// notMigrated explains a missing table: the database has not been
// migrated (for this -table).
func (c *cli) notMigrated(err error) error {
	cmd, table := "outboxctl", "outbox_event"
	if c.table != "" {
		cmd, table = "outboxctl -table "+c.table, c.table
	}
	return fmt.Errorf("the outbox tables (%s and the tables named after it) are missing in this database: create them with %s migrate up\n(%w)", table, cmd, err)
}

// none prints the line of an empty result.
// aggregate names an event's aggregate as type/id, or "-" without one.
func aggregate(typ, id string) string {
	if typ == "" && id == "" {
		return "-"
	}
	return typ + "/" + id
}

func none(w *tabwriter.Writer, what string) { fmt.Fprintf(w, "%s: none\n", what) }

func exactly(n int) func(int) bool { return func(k int) bool { return k == n } }

// out prints v as JSON with -json, and otherwise calls text with an
// aligned writer.
func (c *cli) out(v any, text func(w *tabwriter.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	w := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	text(w)
	return w.Flush()
}

// age formats a duration for people: "-" for none.
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return "<1s"
	}
	return d.Round(time.Second).String()
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func status(s outbox.Status) string {
	if s == outbox.StatusSplit {
		return "split"
	}
	return s.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// --- migrate

type migrationJSON struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

func (c *cli) migrations(s *sqlstore.Store) ([]migrationJSON, error) {
	all, err := s.Migrations()
	if err != nil {
		return nil, err
	}
	applied, err := s.AppliedMigrations(c.ctx)
	if err != nil {
		return nil, err
	}
	done := map[int]bool{}
	for _, m := range applied {
		done[m.Version] = true
	}
	out := make([]migrationJSON, len(all))
	for i, m := range all {
		out[i] = migrationJSON{Version: m.Version, Name: m.Name, Applied: done[m.Version]}
	}
	return out, nil
}

func (c *cli) migrateStatus(args []string) error {
	return c.withStore(c.flags("migrate status"), args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		ms, err := c.migrations(s)
		if err != nil {
			return err
		}
		return c.out(map[string]any{"migrations": ms}, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED")
			for _, m := range ms {
				fmt.Fprintf(w, "%d\t%s\t%s\n", m.Version, m.Name, yesNo(m.Applied))
			}
		})
	})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (c *cli) migrateUp(args []string) error {
	fs := c.flags("migrate up")
	fs.BoolVar(&c.anyServer, "allow-unsupported-server", false, "migrate even a server known not to work with the outbox (docs/databases.md); at your own risk")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		before, err := c.migrations(s)
		if err != nil {
			return err
		}
		if err := s.Migrate(c.ctx); err != nil {
			return err
		}
		var applied []string
		for _, m := range before {
			if !m.Applied {
				applied = append(applied, m.Name)
			}
		}
		return c.out(map[string]any{"applied": orEmpty(applied)}, func(w *tabwriter.Writer) {
			if len(applied) == 0 {
				fmt.Fprintln(w, "up to date")
			}
			for _, name := range applied {
				fmt.Fprintln(w, "applied", name)
			}
		})
	})
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// --- stats

type statsJSON struct {
	Total struct {
		New   int64 `json:"new"`
		Retry int64 `json:"retry"`
		Done  int64 `json:"done"`
		// Dead counts the dead letters: DeadEvents (dead as a whole) and
		// DeadDeliveries (of split events), as dead list lists them.
		Dead           int64   `json:"dead"`
		DeadEvents     int64   `json:"dead_events"`
		DeadDeliveries int64   `json:"dead_deliveries"`
		Split          int64   `json:"split"`
		Unknown        int64   `json:"unknown"`
		OldestSeconds  float64 `json:"oldest_seconds"`
	} `json:"total"`
	Types         []typeJSON `json:"types"`
	Subscriptions []subJSON  `json:"subscriptions"`
}

type typeJSON struct {
	Type  string `json:"type"`
	New   int64  `json:"new"`
	Retry int64  `json:"retry"`
	// Dead counts the type's dead letters: DeadEvents + DeadDeliveries.
	Dead           int64   `json:"dead"`
	DeadEvents     int64   `json:"dead_events"`
	DeadDeliveries int64   `json:"dead_deliveries"`
	Split          int64   `json:"split"`
	OldestSeconds  float64 `json:"oldest_seconds"`
}

type subJSON struct {
	Name        string   `json:"name"`
	Types       []string `json:"types"`
	Paused      bool     `json:"paused"`
	Pending     int64    `json:"pending"`
	Retrying    int64    `json:"retrying"`
	Dead        int64    `json:"dead"`
	LagSeconds  float64  `json:"lag_seconds"`
	IdleSeconds float64  `json:"idle_seconds"`
	// Unregistered: no instance registers it (retired, or unknown), yet
	// it holds deliveries; outboxctl retire settles them.
	Unregistered bool `json:"unregistered,omitempty"`
}

func (c *cli) stats(args []string) error {
	fs := c.flags("stats")
	watch := fs.Duration("watch", 0, "print again every interval until interrupted")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		for {
			if err := c.statsOnce(s); err != nil {
				return err
			}
			if *watch <= 0 {
				return nil
			}
			select {
			case <-c.ctx.Done():
				return nil
			case <-time.After(*watch):
			}
			if !c.json {
				fmt.Fprintln(c.stdout)
			}
		}
	})
}

func (c *cli) statsOnce(s *sqlstore.Store) error {
	st, err := s.Stats(c.ctx)
	if err != nil {
		return err
	}
	types, err := s.StatsByType(c.ctx)
	if err != nil {
		return err
	}
	subs, err := s.Subscriptions(c.ctx)
	if err != nil {
		return err
	}
	infos := make([]driver.SubscriptionInfo, len(subs))
	for i, sub := range subs {
		infos[i] = sub.SubscriptionInfo
	}
	lags, err := s.Lag(c.ctx, infos)
	if err != nil {
		return err
	}
	var v statsJSON
	v.Total.New, v.Total.Retry, v.Total.Done, v.Total.Split, v.Total.Unknown = st.New, st.Retry, st.Done, st.Split, st.Unknown
	v.Total.Dead, v.Total.DeadEvents, v.Total.DeadDeliveries = st.DeadLetters(), st.Dead, st.DeadDeliveries
	v.Total.OldestSeconds = seconds(st.OldestPending)
	v.Types = []typeJSON{}
	for _, t := range types {
		v.Types = append(v.Types, typeJSON{Type: string(t.Type), New: t.New, Retry: t.Retry, Dead: t.Dead + t.DeadDeliveries, DeadEvents: t.Dead, DeadDeliveries: t.DeadDeliveries,
			Split: t.Split, OldestSeconds: seconds(t.Oldest)})
	}
	v.Subscriptions = []subJSON{}
	for i, sub := range subs {
		j := subJSON{Name: sub.Name, Types: []string{}, Paused: sub.Paused, IdleSeconds: seconds(sub.Idle)}
		for _, t := range sub.Types {
			j.Types = append(j.Types, string(t))
		}
		l := lags[i]
		j.Pending, j.Retrying, j.Dead, j.LagSeconds = l.Pending, l.Retrying, l.Dead, seconds(l.Oldest)
		v.Subscriptions = append(v.Subscriptions, j)
	}
	for _, l := range lags[len(subs):] { // holding deliveries, registered by no instance
		v.Subscriptions = append(v.Subscriptions, subJSON{Name: l.Subscription, Types: []string{}, Unregistered: true,
			Pending: l.Pending, Retrying: l.Retrying, Dead: l.Dead, LagSeconds: seconds(l.Oldest)})
	}
	return c.out(v, func(w *tabwriter.Writer) { statsText(w, v) })
}

// statsText prints stats: the headline, then per type and per
// subscription. DEAD is the dead letters everywhere (the events dead as a
// whole and the dead deliveries of split events), as dead list lists
// them.
func statsText(w *tabwriter.Writer, v statsJSON) {
	t := v.Total
	fmt.Fprintln(w, "EVENTS\tNEW\tRETRY\tDEAD\tSPLIT\tDONE\tOLDEST")
	fmt.Fprintf(w, "all\t%d\t%d\t%d\t%d\t%d\t%s\n", t.New, t.Retry, t.Dead, t.Split, t.Done, age(time.Duration(t.OldestSeconds*float64(time.Second))))
	if t.Dead > 0 {
		fmt.Fprintf(w, "dead letters: %d (events dead as a whole: %d, dead deliveries of split events: %d)\n", t.Dead, t.DeadEvents, t.DeadDeliveries)
	}
	fmt.Fprintln(w)
	if len(v.Types) == 0 {
		none(w, "event types with undelivered events")
	} else {
		fmt.Fprintln(w, "TYPE\tNEW\tRETRY\tDEAD\tSPLIT\tOLDEST")
	}
	for _, t := range v.Types {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\n", esc(t.Type), t.New, t.Retry, t.Dead, t.Split, age(time.Duration(t.OldestSeconds*float64(time.Second))))
	}
	fmt.Fprintln(w)
	if len(v.Subscriptions) == 0 {
		none(w, "subscriptions")
		return
	}
	fmt.Fprintln(w, "SUBSCRIPTION\tTYPES\tPAUSED\tPENDING\tRETRYING\tDEAD\tLAG\tIDLE")
	for _, j := range v.Subscriptions {
		types := "*"
		if len(j.Types) > 0 {
			types = strings.Join(j.Types, ",")
		}
		idle := age(time.Duration(j.IdleSeconds * float64(time.Second)))
		if j.Unregistered {
			types, idle = "-", "unregistered (outboxctl retire)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", esc(j.Name), esc(types), yesNo(j.Paused), j.Pending, j.Retrying, j.Dead,
			age(time.Duration(j.LagSeconds*float64(time.Second))), idle)
	}
}

// --- dead letters

// filtered reports whether f selects by anything: without, a command
// acts on every dead letter.
func filtered(f outbox.DeadFilter) bool {
	return f.Subscription != "" || f.Type != "" || !f.Since.IsZero() || !f.Until.IsZero() || f.ErrorContains != "" || len(f.IDs) > 0
}

// filterFlags adds the dead-letter filters to fs.
func filterFlags(fs *flag.FlagSet) func() (outbox.DeadFilter, error) {
	var f outbox.DeadFilter
	fs.StringVar(&f.Subscription, "sub", "", "only the dead deliveries of this subscription")
	fs.Func("type", "only this event type", func(v string) error { f.Type = v; return nil })
	fs.Func("since", "only events created at or after: RFC 3339, or a duration ago", func(v string) (err error) {
		f.Since, err = parseTime(v)
		return err
	})
	fs.Func("until", "only events created before: RFC 3339, or a duration ago", func(v string) (err error) {
		f.Until, err = parseTime(v)
		return err
	})
	fs.StringVar(&f.ErrorContains, "error", "", "only dead letters whose last error contains this text")
	return func() (outbox.DeadFilter, error) { return f, nil }
}

func parseTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t.UTC(), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return time.Now().UTC().Add(-d), nil
	}
	return time.Time{}, errors.New("want RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (24h)")
}

type deadJSON struct {
	ID            string    `json:"id"`
	Subscription  string    `json:"subscription,omitempty"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	TenantID      string    `json:"tenant_id,omitempty"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

func deadJSONs(dls []outbox.DeadLetter) []deadJSON {
	out := make([]deadJSON, len(dls))
	for i, d := range dls {
		out[i] = deadJSON{ID: d.ID, Subscription: d.Subscription, Type: string(d.Type), AggregateType: d.AggregateType, AggregateID: d.AggregateID,
			TenantID: d.TenantID, Attempts: d.Attempts, LastError: d.LastError, CreatedAt: d.CreatedAt.UTC()}
	}
	return out
}

// oneLine shortens an error for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

func (c *cli) deadList(args []string) error {
	fs := c.flags("dead list")
	filter := filterFlags(fs)
	limit := fs.Int("limit", 100, "the most dead letters to list (0: all)")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		f, err := filter()
		if err != nil {
			return err
		}
		var all []outbox.DeadLetter
		for {
			f.Limit = 500
			if *limit > 0 {
				f.Limit = min(500, *limit-len(all))
			}
			page, err := s.FindDead(c.ctx, f)
			if err != nil {
				return err
			}
			all = append(all, page...)
			if len(page) == 0 || (*limit > 0 && len(all) >= *limit) {
				break
			}
			f.After = page[len(page)-1].ID
		}
		return c.out(map[string]any{"dead": deadJSONs(all)}, func(w *tabwriter.Writer) {
			if len(all) == 0 {
				none(w, "dead letters")
				return
			}
			fmt.Fprintln(w, "ID\tSUBSCRIPTION\tTYPE\tAGGREGATE\tATTEMPTS\tCREATED\tERROR")
			for _, d := range all {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", esc(d.ID), esc(orDash(d.Subscription)), esc(d.Type), esc(aggregate(d.AggregateType, d.AggregateID)), d.Attempts,
					d.CreatedAt.UTC().Format(time.RFC3339), esc(oneLine(d.LastError, 60)))
			}
		})
	})
}

type deliveryJSON struct {
	Subscription string `json:"subscription"`
	Status       string `json:"status"`
	Attempts     int    `json:"attempts"`
	Owner        string `json:"owner,omitempty"`
	LastError    string `json:"last_error,omitempty"`
}

type recordJSON struct {
	ID            string          `json:"id"`
	Type          string          `json:"type"`
	AggregateType string          `json:"aggregate_type"`
	AggregateID   string          `json:"aggregate_id"`
	TenantID      string          `json:"tenant_id,omitempty"`
	Status        string          `json:"status"`
	Attempts      int             `json:"attempts"`
	OccurredAt    time.Time       `json:"occurred_at"`
	CreatedAt     time.Time       `json:"created_at"`
	Owner         string          `json:"owner,omitempty"`
	LastError     string          `json:"last_error,omitempty"`
	ReadError     string          `json:"read_error,omitempty"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	Deliveries    []deliveryJSON  `json:"deliveries"`
	Payload       *string         `json:"payload,omitempty"`
	// DeliveredAt and DeliveredBy are set for an archived event.
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	DeliveredBy string     `json:"delivered_by,omitempty"`
}

func (c *cli) deadShow(args []string) error {
	fs := c.flags("dead show")
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

// recordView is what dead show prints of r, the payload only if asked.
func recordView(r outbox.Record, withPayload bool) recordJSON {
	v := recordJSON{ID: r.ID, Type: r.Type, AggregateType: r.AggregateType, AggregateID: r.AggregateID, TenantID: r.TenantID,
		Status: status(r.Status), Attempts: r.Attempts, OccurredAt: r.OccurredAt.UTC(), CreatedAt: r.CreatedAt.UTC(),
		Owner: r.Owner, LastError: r.LastError, Deliveries: []deliveryJSON{}}
	if r.ReadError != nil {
		v.ReadError = r.ReadError.Error()
	}
	if r.Archived() {
		at := r.DeliveredAt.UTC()
		v.DeliveredAt, v.DeliveredBy = &at, r.DeliveredBy
	}
	if len(r.Headers) > 0 && json.Valid(r.Headers) {
		v.Headers = r.Headers
	}
	for _, d := range r.Deliveries {
		v.Deliveries = append(v.Deliveries, deliveryJSON{Subscription: d.Subscription, Status: status(d.Status), Attempts: d.Attempts, Owner: d.Owner, LastError: d.LastError})
	}
	if withPayload {
		p := string(r.Payload)
		if !utf8.Valid(r.Payload) {
			p = fmt.Sprintf("%q", r.Payload)
		}
		v.Payload = &p
	}
	return v
}

// printRecord prints v as dead show's text: the event, its deliveries,
// its payload.
func (c *cli) printRecord(w *tabwriter.Writer, v recordJSON) {
	fmt.Fprintf(w, "id\t%s\n", esc(v.ID))
	fmt.Fprintf(w, "type\t%s\n", esc(v.Type))
	fmt.Fprintf(w, "aggregate\t%s/%s\n", esc(v.AggregateType), esc(v.AggregateID))
	if v.TenantID != "" {
		fmt.Fprintf(w, "tenant\t%s\n", esc(v.TenantID))
	}
	fmt.Fprintf(w, "status\t%s\n", v.Status)
	fmt.Fprintf(w, "attempts\t%d\n", v.Attempts)
	fmt.Fprintf(w, "occurred\t%s\n", v.OccurredAt.Format(time.RFC3339))
	fmt.Fprintf(w, "created\t%s\n", v.CreatedAt.Format(time.RFC3339))
	fmt.Fprintf(w, "owner\t%s\n", esc(orDash(v.Owner)))
	if v.DeliveredAt != nil {
		fmt.Fprintf(w, "archived\tdelivered %s by %s\n", v.DeliveredAt.Format(time.RFC3339), esc(v.DeliveredBy))
	}
	fmt.Fprintf(w, "last error\t%s\n", esc(orDash(oneLine(v.LastError, 200))))
	if v.ReadError != "" {
		fmt.Fprintf(w, "read error\t%s\n", esc(v.ReadError))
	}
	if v.Headers != nil {
		fmt.Fprintf(w, "headers\t%s\n", esc(string(v.Headers)))
	}
	w.Flush()
	if len(v.Deliveries) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "SUBSCRIPTION\tSTATUS\tATTEMPTS\tOWNER\tERROR")
		for _, d := range v.Deliveries {
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", esc(d.Subscription), d.Status, d.Attempts, esc(orDash(d.Owner)), esc(orDash(oneLine(d.LastError, 60))))
		}
		w.Flush()
	}
	if v.Payload != nil {
		// Straight to stdout, past the aligned writer: a payload's
		// tabs are its own.
		fmt.Fprintln(c.stdout)
		fmt.Fprintln(c.stdout, "payload:")
		fmt.Fprintln(c.stdout, escLines(*v.Payload))
	} else {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "(payload not shown: add -payload)")
	}
}

// lettersOf returns the dead letters of the given event ids: the event if
// it is DEAD, and its dead deliveries (of sub only, if set).
func lettersOf(ctx context.Context, s *sqlstore.Store, ids []string, sub string) ([]outbox.DeadLetter, error) {
	var out []outbox.DeadLetter
	for _, id := range ids {
		r, err := s.Inspect(ctx, id)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.Status == outbox.StatusDead && sub == "" {
			out = append(out, outbox.DeadLetter{ID: r.ID, Type: r.Type})
		}
		for _, d := range r.Deliveries {
			if d.Status == outbox.StatusDead && (sub == "" || sub == d.Subscription) {
				out = append(out, outbox.DeadLetter{ID: r.ID, Subscription: d.Subscription, Type: r.Type})
			}
		}
	}
	return out, nil
}

// eachPage calls f with the dead letters that ids (if any) or f select,
// page by page of at most size.
func eachPage(ctx context.Context, s *sqlstore.Store, ids []string, filter outbox.DeadFilter, size int, f func([]outbox.DeadLetter) error) error {
	if len(ids) > 0 {
		dls, err := lettersOf(ctx, s, ids, filter.Subscription)
		if err != nil {
			return err
		}
		for len(dls) > 0 {
			k := min(size, len(dls))
			if err := f(dls[:k]); err != nil {
				return err
			}
			dls = dls[k:]
		}
		return nil
	}
	filter.Limit = size
	for {
		page, err := s.FindDead(ctx, filter)
		if err != nil || len(page) == 0 {
			return err
		}
		if err := f(page); err != nil {
			return err
		}
		filter.After = page[len(page)-1].ID
	}
}

func letterName(d outbox.DeadLetter) string {
	if d.Subscription == "" {
		return d.ID
	}
	return d.ID + "/" + d.Subscription
}

// firstIDs is how many ids a dry run prints.
const firstIDs = 10

type countJSON struct {
	DryRun bool     `json:"dry_run,omitempty"`
	Count  int      `json:"count"`
	First  []string `json:"first,omitempty"`
}

// noteFirst adds the names of page's dead letters to v.First while it
// holds fewer than firstIDs.
func (v *countJSON) noteFirst(page []outbox.DeadLetter) {
	for _, d := range page {
		if len(v.First) < firstIDs {
			v.First = append(v.First, letterName(d))
		}
	}
}

// outCount prints v, the outcome of dead replay, dead purge or skip, with text
// for the text form. When v counts nothing it prints v as JSON only and
// returns the "nothing matched" error.
func (c *cli) outCount(v countJSON, text func(w *tabwriter.Writer)) error {
	if v.Count == 0 {
		if c.json {
			if err := c.out(v, nil); err != nil {
				return err
			}
		}
		return nothing("no dead letters matched")
	}
	return c.out(v, text)
}

func (c *cli) deadReplay(args []string) error {
	fs := c.flags("dead replay")
	filter := filterFlags(fs)
	dryRun := fs.Bool("dry-run", false, "change nothing: print the count and the first ids")
	yes := fs.Bool("yes", false, "replay every dead letter when no id or filter is given; without it, count only and exit 3")
	rate := fs.Float64("rate", 100, "the most dead letters replayed per second (0: no limit)")
	return c.withStore(fs, args, nil, func(s *sqlstore.Store, ids []string) error {
		f, err := filter()
		if err != nil {
			return err
		}
		if *rate < 0 {
			return usageErr("-rate %v: want ≥ 0", *rate)
		}
		// Every dead letter, unasked for: count them and stop, as purge
		// does without -yes.
		unconfirmed := len(ids) == 0 && !filtered(f) && !*yes && !*dryRun
		r := &replayer{c: c, s: s, rate: *rate}
		r.v.DryRun = *dryRun || unconfirmed
		r.start = time.Now()
		if err := eachPage(c.ctx, s, ids, f, replayPageSize(*rate), r.replay); err != nil {
			return fmt.Errorf("replayed %d, then: %w", r.v.Count, err)
		}
		if err := c.outCount(r.v, func(w *tabwriter.Writer) { replayText(w, r.v, unconfirmed) }); err != nil {
			return err
		}
		if unconfirmed {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

// replayPageSize is how many dead letters dead replay takes at a time at
// rate letters per second (0: no limit): 500, or fewer to stay near rate.
func replayPageSize(rate float64) int {
	if rate > 0 {
		return max(1, min(500, int(rate)))
	}
	return 500
}

// replayer replays dead letters for dead replay, page by page, at most
// rate per second since start (0: no limit), counting them in v. With
// v.DryRun it only counts them.
type replayer struct {
	c     *cli
	s     *sqlstore.Store
	rate  float64
	start time.Time
	v     countJSON
}

// replay replays (or counts) one page of dead letters, then waits as long
// as the rate asks.
func (r *replayer) replay(page []outbox.DeadLetter) error {
	r.v.noteFirst(page)
	if r.v.DryRun {
		r.v.Count += len(page)
		return nil
	}
	n, err := r.s.ReplayLetters(r.c.ctx, page)
	r.v.Count += n
	if err != nil {
		return err
	}
	return r.pace()
}

// pace waits until the letters replayed so far have taken at least
// v.Count / rate since start, or returns ctx's error if it ends first.
func (r *replayer) pace() error {
	if r.rate > 0 {
		wait := time.Until(r.start.Add(time.Duration(float64(r.v.Count) / r.rate * float64(time.Second))))
		select {
		case <-r.c.ctx.Done():
			return r.c.ctx.Err()
		case <-time.After(wait):
		}
	}
	return nil
}

// replayText prints the outcome of dead replay.
func replayText(w *tabwriter.Writer, v countJSON, unconfirmed bool) {
	switch {
	case unconfirmed:
		fmt.Fprintf(w, "would replay %d dead letters: no id or filter selects every one (add -yes to replay them all)\n", v.Count)
	case v.DryRun:
		fmt.Fprintf(w, "would replay %d dead letters\n", v.Count)
	default:
		fmt.Fprintf(w, "replayed %d dead letters\n", v.Count)
	}
	if v.DryRun {
		for _, id := range v.First {
			fmt.Fprintln(w, esc(id))
		}
		if v.Count > len(v.First) {
			fmt.Fprintln(w, "…")
		}
	}
}

func (c *cli) deadPurge(args []string) error {
	fs := c.flags("dead purge")
	filter := filterFlags(fs)
	yes := fs.Bool("yes", false, "really delete; without it, count only and exit 3")
	return c.withStore(fs, args, nil, func(s *sqlstore.Store, ids []string) error {
		f, err := filter()
		if err != nil {
			return err
		}
		var v countJSON
		v.DryRun = !*yes
		err = eachPage(c.ctx, s, ids, f, 500, func(page []outbox.DeadLetter) error {
			v.noteFirst(page)
			if !*yes {
				v.Count += len(page)
				return nil
			}
			n, err := s.PurgeLetters(c.ctx, page)
			v.Count += n
			return err
		})
		if err != nil {
			return fmt.Errorf("purged %d, then: %w", v.Count, err)
		}
		if err := c.outCount(v, func(w *tabwriter.Writer) { purgeText(w, v) }); err != nil {
			return err
		}
		if !*yes {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

// purgeText prints the outcome of dead purge.
func purgeText(w *tabwriter.Writer, v countJSON) {
	if !v.DryRun {
		fmt.Fprintf(w, "purged %d dead letters\n", v.Count)
		return
	}
	fmt.Fprintf(w, "would purge %d dead letters (add -yes to delete them)\n", v.Count)
	for _, id := range v.First {
		fmt.Fprintln(w, esc(id))
	}
	if v.Count > len(v.First) {
		fmt.Fprintln(w, "…")
	}
}

// --- pause, cleanup, peek

func (c *cli) pause(cmd string, args []string) error {
	return c.withStore(c.flags(cmd), args, exactly(1), func(s *sqlstore.Store, args []string) error {
		ok, err := s.SetPaused(c.ctx, args[0], cmd == "pause")
		if err != nil {
			return err
		}
		if !ok {
			return nothing("no subscription %q", args[0])
		}
		return c.out(map[string]any{"subscription": args[0], "paused": cmd == "pause"}, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "%sd %s\n", cmd, esc(args[0]))
		})
	})
}

func (c *cli) cleanup(args []string) error {
	fs := c.flags("cleanup")
	older := fs.Duration("older", 7*24*time.Hour, "delete events delivered (or given up) longer ago than this")
	dead := fs.Bool("dead", false, "delete dead events too (and finished split events)")
	limit := fs.Int("limit", 1000, "rows per delete")
	dryRun := fs.Bool("dry-run", false, "count only")
	yes := fs.Bool("yes", false, "really delete; without it, count only and exit 3")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		if *limit <= 0 {
			return usageErr("-limit %d: want > 0", *limit)
		}
		if *older < 0 {
			return usageErr("-older %v: want ≥ 0 (how long ago the events were delivered or given up)", *older)
		}
		// Cleanup has no filter but age: it deletes only with -yes.
		unconfirmed := !*yes && !*dryRun
		var total int64
		var err error
		if *dryRun || unconfirmed {
			total, err = s.CleanupCount(c.ctx, *older, *dead)
		} else {
			total, err = cleanupAll(c.ctx, s, *older, *limit, *dead)
		}
		if err != nil {
			return err
		}
		if err := c.out(countJSON{DryRun: *dryRun || unconfirmed, Count: int(total)}, func(w *tabwriter.Writer) {
			cleanupText(w, total, unconfirmed, *dryRun)
		}); err != nil {
			return err
		}
		if unconfirmed {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

// cleanupAll deletes what Cleanup selects, limit rows at a time, until
// none is left, and returns how many it deleted.
func cleanupAll(ctx context.Context, s *sqlstore.Store, older time.Duration, limit int, dead bool) (int64, error) {
	var total int64
	for {
		n, err := s.Cleanup(ctx, older, limit, dead)
		total += n
		if err != nil {
			return total, fmt.Errorf("deleted %d, then: %w", total, err)
		}
		if n == 0 {
			return total, nil
		}
	}
}

// cleanupText prints the outcome of cleanup.
func cleanupText(w *tabwriter.Writer, total int64, unconfirmed, dryRun bool) {
	switch {
	case unconfirmed:
		fmt.Fprintf(w, "would delete %d events (add -yes to delete them)\n", total)
	case dryRun:
		fmt.Fprintf(w, "would delete %d events\n", total)
	default:
		fmt.Fprintf(w, "deleted %d events\n", total)
	}
}

type dueJSON struct {
	ID           string  `json:"id"`
	Subscription string  `json:"subscription,omitempty"`
	Type         string  `json:"type"`
	Status       string  `json:"status"`
	Attempts     int     `json:"attempts"`
	DueInSeconds float64 `json:"due_in_seconds"`
	Owner        string  `json:"owner,omitempty"`
}

func (c *cli) peek(args []string) error {
	fs := c.flags("peek")
	limit := fs.Int("limit", 20, "how many")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		due, err := s.Peek(c.ctx, *limit)
		if err != nil {
			return err
		}
		out := make([]dueJSON, len(due))
		for i, d := range due {
			out[i] = dueJSON{ID: d.ID, Subscription: d.Subscription, Type: string(d.Type), Status: status(d.Status), Attempts: d.Attempts,
				DueInSeconds: max(0, seconds(d.In)), Owner: d.Owner}
		}
		return c.out(map[string]any{"due": out}, func(w *tabwriter.Writer) {
			if len(due) == 0 {
				none(w, "due")
				return
			}
			fmt.Fprintln(w, "ID\tSUBSCRIPTION\tTYPE\tSTATUS\tATTEMPTS\tDUE\tLEASED BY")
			for _, d := range due {
				when := "now"
				if d.In > 0 {
					when = "in " + age(d.In)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", esc(d.ID), esc(orDash(d.Subscription)), esc(string(d.Type)), status(d.Status), d.Attempts, when, esc(orDash(d.Owner)))
			}
		})
	})
}

type partitionJSON struct {
	Name   string `json:"name"`
	Before string `json:"before,omitempty"`
	Rows   int64  `json:"rows_estimate"`
}

func (c *cli) partitionsStatus(args []string) error {
	fs := c.flags("partitions status")
	archive := fs.Bool("archive", false, "the archive's partitions (by the day its events were delivered)")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		list, table := s.Partitions, s.Table()
		if *archive {
			list, table = s.ArchivePartitions, s.ArchiveTable()
		}
		ps, err := list(c.ctx)
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			return fmt.Errorf("%s is not partitioned (outboxctl partitions maintain -create partitions it)", table)
		}
		out := make([]partitionJSON, len(ps))
		for i, p := range ps {
			out[i] = partitionJSON{Name: p.Name, Rows: p.Rows}
			if !p.Before.IsZero() {
				out[i].Before = p.Before.Format(time.DateOnly)
			}
		}
		return c.out(out, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "PARTITION\tBEFORE\tROWS (ESTIMATE)")
			for _, p := range out {
				fmt.Fprintf(w, "%s\t%s\t%d\n", p.Name, cmp.Or(p.Before, "-"), p.Rows)
			}
		})
	})
}

type maintainJSON struct {
	Created        bool             `json:"created,omitempty"`
	Busy           bool             `json:"busy,omitempty"`
	Added          []string         `json:"added"`
	Dropped        []string         `json:"dropped"`
	Kept           map[string]int64 `json:"kept_undelivered,omitempty"`
	ArchiveAdded   []string         `json:"archive_added"`
	ArchiveDropped []string         `json:"archive_dropped"`
}

func (c *cli) partitionsMaintain(args []string) error {
	fs := c.flags("partitions maintain")
	create := fs.Bool("create", false, "partition the table first if it is not")
	ahead := fs.Int("ahead", 7, "days ahead that get their partition")
	retention := fs.Duration("retention", 0, "drop day partitions that ended longer ago than this, when nothing in them is undelivered (0: drop none)")
	dead := fs.Bool("dead", false, "drop partitions holding dead events too")
	archiveRetention := fs.Duration("archive-retention", 0, "drop the archive's day partitions that ended longer ago than this, with their archived events (0: drop none)")
	yes := fs.Bool("yes", false, "really drop partitions past -retention or -archive-retention")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		for name, d := range map[string]time.Duration{"retention": *retention, "archive-retention": *archiveRetention} {
			if d < 0 {
				return usageErr("-%s %v: want ≥ 0", name, d)
			}
			if d > 0 && !*yes {
				return usageErr("-%s %v drops the day partitions past it, with their rows: add -yes (partitions status [-archive] lists them)", name, d)
			}
		}
		cfg := sqlstore.PartitionConfig{Ahead: *ahead, Retention: *retention, DropDead: *dead, ArchiveRetention: *archiveRetention}
		var out maintainJSON
		if *create {
			created, err := partitionIfNot(c.ctx, s, cfg)
			if err != nil {
				return err
			}
			out.Created = created
		}
		res, err := s.MaintainPartitions(c.ctx, cfg)
		if err != nil {
			return err
		}
		out.Busy, out.Added, out.Dropped, out.Kept = res.Busy, append([]string{}, res.Added...), append([]string{}, res.Dropped...), res.Kept
		out.ArchiveAdded, out.ArchiveDropped = append([]string{}, res.ArchiveAdded...), append([]string{}, res.ArchiveDropped...)
		return c.out(out, func(w *tabwriter.Writer) {
			if out.Created {
				fmt.Fprintf(w, "partitioned %s and %s by day\n", s.Table(), s.ArchiveTable())
			}
			if out.Busy {
				fmt.Fprintln(w, "another session is maintaining the partitions; nothing done")
				return
			}
			fmt.Fprintf(w, "added %d: %s\n", len(out.Added), strings.Join(out.Added, " "))
			fmt.Fprintf(w, "dropped %d: %s\n", len(out.Dropped), strings.Join(out.Dropped, " "))
			for _, name := range slices.Sorted(maps.Keys(out.Kept)) {
				fmt.Fprintf(w, "kept %s: %d events not delivered yet\n", name, out.Kept[name])
			}
			if len(out.ArchiveAdded)+len(out.ArchiveDropped) > 0 {
				fmt.Fprintf(w, "archive added %d: %s\n", len(out.ArchiveAdded), strings.Join(out.ArchiveAdded, " "))
				fmt.Fprintf(w, "archive dropped %d: %s\n", len(out.ArchiveDropped), strings.Join(out.ArchiveDropped, " "))
			}
		})
	})
}

// partitionIfNot partitions the table and the archive if either is not
// partitioned yet, and reports whether it did.
func partitionIfNot(ctx context.Context, s *sqlstore.Store, cfg sqlstore.PartitionConfig) (bool, error) {
	ps, err := s.Partitions(ctx)
	if err != nil {
		return false, err
	}
	as, err := s.ArchivePartitions(ctx)
	if err != nil {
		return false, err
	}
	if len(ps) > 0 && len(as) > 0 {
		return false, nil
	}
	return true, s.Partition(ctx, cfg)
}

// --- ordering: blocked keys, skip

// orderFilter reads the ordered subscriptions from -ordered and
// -skip-dead, or, with neither, from the subscriptions table (each
// instance records its subscriptions' Order there when it starts).
func orderFilter(fs *flag.FlagSet) func(context.Context, *sqlstore.Store) (driver.OrderFilter, error) {
	var block, skip string
	fs.StringVar(&block, "ordered", "", "the Ordered subscriptions, comma-separated (default: those the subscriptions table records as Ordered)")
	fs.StringVar(&skip, "skip-dead", "", "the OrderedSkipDead subscriptions, comma-separated (default: from the subscriptions table)")
	names := func(v string) []string {
		var out []string
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	return func(ctx context.Context, s *sqlstore.Store) (driver.OrderFilter, error) {
		f := driver.OrderFilter{Block: names(block), Skip: names(skip)}
		if f.Empty() {
			subs, err := s.Subscriptions(ctx)
			if err != nil {
				return f, err
			}
			for _, sub := range subs {
				switch sub.Order {
				case 1:
					f.Block = append(f.Block, sub.Name)
				case 2:
					f.Skip = append(f.Skip, sub.Name)
				}
			}
		}
		return f, nil
	}
}

type blockedJSON struct {
	Key          string  `json:"key"`
	Subscription string  `json:"subscription"` // "": dead as a whole, every Ordered one
	EventID      string  `json:"event_id"`
	Type         string  `json:"type"`
	Waiting      int64   `json:"waiting"`
	Since        string  `json:"since"`
	AgeSeconds   float64 `json:"age_seconds"`
}

func (c *cli) blockedKeys(args []string) error {
	fs := c.flags("blocked-keys")
	filter := orderFilter(fs)
	after := fs.String("after", "", "list the keys after this one (paging)")
	limit := fs.Int("limit", 100, "how many")
	return c.withStore(fs, args, exactly(0), func(s *sqlstore.Store, _ []string) error {
		if *limit < 1 {
			return usageErr("-limit %d: want ≥ 1", *limit)
		}
		f, err := filter(c.ctx, s)
		if err != nil {
			return err
		}
		var ks []driver.BlockedKey
		note := ""
		if len(f.Block) == 0 {
			// Nothing can be blocked: an empty result, and why.
			note = "no subscription is registered as Ordered in the subscriptions table (an instance registers its subscriptions when it starts), so no key can be blocked; name them with -ordered a,b"
			fmt.Fprintln(c.stderr, "outboxctl: note:", note)
		} else if ks, err = s.BlockedKeys(c.ctx, f, *after, *limit); err != nil {
			return err
		}
		now := time.Now()
		out := make([]blockedJSON, len(ks))
		for i, k := range ks {
			out[i] = blockedJSON{Key: k.Key, Subscription: k.Subscription, EventID: k.EventID, Type: k.Type, Waiting: k.Waiting,
				Since: k.Since.UTC().Format(time.RFC3339), AgeSeconds: seconds(now.Sub(k.Since))}
		}
		v := map[string]any{"blocked": out}
		if len(ks) >= *limit {
			v["next"] = ks[len(ks)-1].Key
		}
		if note != "" {
			v["note"] = note
		}
		return c.out(v, func(w *tabwriter.Writer) {
			if len(ks) == 0 {
				none(w, "blocked keys")
				return
			}
			fmt.Fprintln(w, "KEY\tSUBSCRIPTION\tDEAD EVENT\tTYPE\tWAITING\tSINCE")
			for _, k := range ks {
				sub := k.Subscription
				if sub == "" {
					sub = "(all ordered)"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\n", esc(k.Key), esc(sub), esc(k.EventID), esc(k.Type), k.Waiting, k.Since.UTC().Format(time.RFC3339))
			}
			if len(ks) >= *limit {
				fmt.Fprintf(w, "… more: -after %s\n", esc(ks[len(ks)-1].Key))
			}
		})
	})
}

func (c *cli) skip(args []string) error {
	fs := c.flags("skip")
	yes := fs.Bool("yes", false, "really skip; without it, count only and exit 3")
	return c.withStore(fs, args, func(n int) bool { return n > 0 }, func(s *sqlstore.Store, ids []string) error {
		dls, err := lettersOf(c.ctx, s, ids, "")
		if err != nil {
			return err
		}
		v := countJSON{DryRun: !*yes, Count: len(dls)}
		v.noteFirst(dls)
		if *yes && len(dls) > 0 {
			if v.Count, err = s.SkipDead(c.ctx, ids); err != nil {
				return fmt.Errorf("skip: %w", err)
			}
		}
		if err := c.outCount(v, func(w *tabwriter.Writer) { skipText(w, v, len(dls)) }); err != nil {
			return err
		}
		if !*yes {
			return &exitErr{code: exitNothing}
		}
		return nil
	})
}

// skipText prints the outcome of skip, of letters dead letters selected.
func skipText(w *tabwriter.Writer, v countJSON, letters int) {
	if v.DryRun {
		fmt.Fprintf(w, "would skip %d dead letters (add -yes to give up on them)\n", v.Count)
	} else {
		fmt.Fprintf(w, "skipped %d dead letters: done for good, their keys go on\n", v.Count)
	}
	for _, id := range v.First {
		fmt.Fprintln(w, esc(id))
	}
	if letters > len(v.First) {
		fmt.Fprintln(w, "…")
	}
}
