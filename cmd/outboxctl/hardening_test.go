package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Every command, subcommand group and subcommand prints its help on
// stdout and exits 0 for -h, -help and --help (issue 37, item 13).
func TestHelpExitsZero(t *testing.T) {
	for _, cmd := range [][]string{
		{}, {"migrate"}, {"migrate", "up"}, {"migrate", "status"}, {"stats"},
		{"dead"}, {"dead", "list"}, {"dead", "show"}, {"dead", "replay"}, {"dead", "purge"},
		{"pause"}, {"resume"}, {"cleanup"}, {"peek"}, {"blocked-keys"}, {"skip"},
		{"partitions"}, {"partitions", "status"}, {"partitions", "maintain"},
	} {
		for _, h := range []string{"-h", "-help", "--help"} {
			args := append(append([]string{}, cmd...), h)
			r := runCtl(t, nil, args...)
			if r.code != exitOK || !strings.Contains(r.stdout, "Usage:") || r.stderr != "" {
				t.Errorf("outboxctl %s: exit %d, stdout %q, stderr %q; want exit 0 and the help on stdout", strings.Join(args, " "), r.code, r.stdout, r.stderr)
			}
			if len(cmd) > 0 && !strings.Contains(r.stdout, "outboxctl "+strings.Join(cmd, " ")) {
				t.Errorf("outboxctl %s: the help does not name the command:\n%s", strings.Join(args, " "), r.stdout)
			}
		}
	}
	// help as a command, also with a command name.
	if r := runCtl(t, nil, "help", "dead"); r.code != exitOK || !strings.Contains(r.stdout, "dead purge") {
		t.Errorf("outboxctl help dead: %+v", r)
	}
}

// On a database without the outbox tables, every command but migrate
// fails naming outboxctl migrate up (with the -table it was given), on
// each database: MySQL error 1146, PostgreSQL 42P01, SQLite "no such
// table" (issue 37, item 13).
func TestUnmigratedNamesMigrateUp(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			for _, args := range [][]string{
				{"stats"}, {"dead", "list"}, {"dead", "show", "x"}, {"dead", "replay", "-dry-run"}, {"dead", "purge"},
				{"peek"}, {"blocked-keys"}, {"cleanup", "-dry-run"}, {"pause", "billing"}, {"skip", "x"},
			} {
				r := f.run(args...)
				want := "outboxctl -table " + f.table + " migrate up"
				if r.code != exitError || !strings.Contains(r.stderr, want) {
					t.Errorf("%s on an unmigrated database: exit %d, stderr %q; want exit 1 naming %q", strings.Join(args, " "), r.code, r.stderr, want)
				}
			}
		})
	}
}

// Text output escapes control and bidi characters from the data (error
// text, aggregate ids, types, payloads, headers, ordering keys), so that
// none reaches the terminal; -json keeps the values as they are (issue
// 37, item 3). On each database.
func TestTextOutputEscapesControls(t *testing.T) {
	const (
		evilErr  = "boom \x1b[31mred\x1b[0m\x07 \u202egnp.exe \u009b2J"
		evilAgg  = "42\x1b]0;pwned\x07"
		evilType = "order.\x1b[5mcreated"
		evilKey  = "key\u2066\x1b[1m"
		evilBody = "hello \x1b[2J\x7f\r\u202e"
	)
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate: %+v", r)
			}
			ctx, s := context.Background(), f.s
			if _, err := s.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "billing", Order: 1}}); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for i := range 2 {
				r := driver.Row{ID: outbox.NewID(), Type: evilType, AggregateType: "order", AggregateID: evilAgg, OrderingKey: evilKey,
					Headers: []byte(`{"x-note":"` + "\u202e\u0085" + `"}`), Payload: []byte(evilBody), OccurredAt: time.Now()}
				owner := ""
				if i == 0 {
					owner = "seed"
				}
				if _, _, err := s.InsertOrdered(ctx, s.DB(), &r, owner, time.Minute, driver.OrderFilter{Block: []string{"billing"}}); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, r.ID)
			}
			if ok, err := s.MarkDead(ctx, "seed", ids[0], evilErr); !ok || err != nil {
				t.Fatalf("mark dead: %v %v", ok, err)
			}
			for _, args := range [][]string{
				{"stats"}, {"dead", "list"}, {"dead", "show", ids[0], "-payload"}, {"peek"}, {"blocked-keys"},
				{"dead", "show", "\x1b[31mnope"}, {"pause", "\u202ebilling"},
			} {
				r := f.run(args...)
				out := r.stdout + r.stderr
				for _, bad := range []string{"\x1b", "\x07", "\x7f", "\r", "\u202e", "\u2066", "\u009b", "\u0085"} {
					if strings.Contains(out, bad) {
						t.Errorf("%q: the output holds %q:\n%s", args, bad, out)
					}
				}
				if !strings.Contains(out, `\x1b`) && !strings.Contains(out, `\u202e`) {
					t.Errorf("%q: no escaped control character in the output:\n%s", args, out)
				}
			}
			// -json stays as it is: the values decode to the raw text.
			var rec recordJSON
			f.decode(f.run("dead", "show", ids[0], "-payload", "-json"), &rec)
			if rec.LastError != evilErr || rec.AggregateID != evilAgg || rec.Type != evilType || rec.Payload == nil || *rec.Payload != evilBody {
				t.Errorf("dead show -json changed the values: %+v", rec)
			}
		})
	}
}

// Commands that delete or replay without a filter need -yes (or
// -dry-run); a negative -older is a usage error (issue 37, item 2). On
// each database.
func TestUnfilteredDeletesNeedYes(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate: %+v", r)
			}
			f.seed()
			dead := func() int {
				var dl struct{ Dead []deadJSON }
				f.decode(f.run("dead", "list", "-json"), &dl)
				return len(dl.Dead)
			}
			if n := dead(); n != 4 {
				t.Fatalf("%d dead letters after seed; want 4", n)
			}
			for _, tc := range []struct {
				args []string
				code int
				want string
			}{
				{[]string{"cleanup", "-dead", "-older", "0s"}, exitNothing, "add -yes"},
				{[]string{"cleanup", "-older", "0s"}, exitNothing, "add -yes"},
				{[]string{"dead", "replay"}, exitNothing, "add -yes"},
				{[]string{"dead", "replay", "-rate", "0"}, exitNothing, "add -yes"},
				{[]string{"dead", "purge"}, exitNothing, "add -yes"},
				{[]string{"cleanup", "-older", "-1h", "-yes"}, exitUsage, "-older -1h0m0s: want ≥ 0"},
				{[]string{"cleanup", "-older", "-1h", "-dry-run"}, exitUsage, "-older"},
			} {
				r := f.run(tc.args...)
				if r.code != tc.code || !strings.Contains(r.stdout+r.stderr, tc.want) {
					t.Errorf("%q: exit %d, output %q; want exit %d with %q", tc.args, r.code, r.stdout+r.stderr, tc.code, tc.want)
				}
			}
			if n := dead(); n != 4 {
				t.Fatalf("%d dead letters after the unconfirmed commands; want still 4", n)
			}
			var v countJSON
			f.decode(f.run("dead", "replay", "-yes", "-rate", "0", "-json"), &v)
			if v.Count != 4 || v.DryRun {
				t.Fatalf("dead replay -yes: %+v; want 4 replayed", v)
			}
			if n := dead(); n != 0 {
				t.Fatalf("%d dead letters after replay -yes; want 0", n)
			}
			f.decode(f.run("cleanup", "-older", "0s", "-dead", "-yes", "-json"), &v)
			if v.Count != 1 || v.DryRun {
				t.Fatalf("cleanup -yes: %+v; want the one DONE event deleted", v)
			}
		})
	}
}

// Empty results say so instead of printing a bare header; blocked-keys
// without an ordered subscription prints an empty result with a note and
// exits 0 (issue 37, item 13). The headline dead count includes the dead
// deliveries of split events (item 12); see also stats.golden.
func TestEmptyResultsSayNone(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate: %+v", r)
			}
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"dead", "list"}, "dead letters: none"},
				{[]string{"peek"}, "due: none"},
				{[]string{"stats"}, "subscriptions: none"},
				{[]string{"blocked-keys", "-ordered", "billing"}, "blocked keys: none"},
				{[]string{"blocked-keys"}, "blocked keys: none"},
			} {
				r := f.run(tc.args...)
				if r.code != exitOK || !strings.Contains(r.stdout, tc.want) {
					t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 0 and %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
				}
			}
			r := f.run("blocked-keys")
			if !strings.Contains(r.stderr, "no subscription is registered as Ordered") {
				t.Errorf("blocked-keys without ordered subscriptions: no note on stderr: %q", r.stderr)
			}
			var bk struct {
				Blocked []blockedJSON
				Note    string
			}
			f.decode(f.run("blocked-keys", "-json"), &bk)
			if bk.Blocked == nil || len(bk.Blocked) != 0 || bk.Note == "" {
				t.Errorf("blocked-keys -json: %+v; want an empty list and a note", bk)
			}
			var st struct {
				Total map[string]float64
				Types []map[string]any
			}
			f.seed()
			f.decode(f.run("stats", "-json"), &st)
			if st.Total["dead"] != 4 || st.Total["dead_events"] != 1 || st.Total["dead_deliveries"] != 3 {
				t.Errorf("stats -json total: %+v; want 4 dead letters: 1 event, 3 deliveries", st.Total)
			}
			for _, ty := range st.Types {
				if ty["type"] == "order.created" && ty["dead"] != 4.0 {
					t.Errorf("stats -json order.created: %+v; want 4 dead letters", ty)
				}
			}
			if got := fmt.Sprint(st.Total["dead"]); !strings.Contains(f.run("stats").stdout, "dead letters: "+got) {
				t.Errorf("stats does not say %s dead letters:\n%s", got, f.run("stats").stdout)
			}
			var js json.RawMessage
			f.decode(f.run("dead", "list", "-json", "-type", "nope"), &js)
			if !strings.Contains(string(js), `"dead": []`) {
				t.Errorf("dead list -json of nothing: %s; want an empty list", js)
			}
		})
	}
}
