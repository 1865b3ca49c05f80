package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// binary is the outboxctl built once for all tests.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "outboxctl-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxctl")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "go build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

func runCtl(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

// fixture is a database with an outbox table for the binary.
type fixture struct {
	t     *testing.T
	db    *sqlx.DB
	dsn   string
	table string
	s     *sqlstore.Store
	ids   map[string]string // event id → E1, E2, …
}

func newFixture(t *testing.T, name string) *fixture {
	f := &fixture{t: t, table: testdb.TableName("ctl"), ids: map[string]string{}}
	switch name {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "ctl.db")
		db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(path))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.Ping(); err != nil { // creates the file
			t.Fatal(err)
		}
		f.db, f.dsn = db, "sqlite:"+path
	case "mysql":
		f.db, f.dsn = testdb.MySQL(t), testdb.MySQLDSN()
	case "postgres":
		f.db, f.dsn = testdb.Postgres(t), testdb.PostgresDSN()
	}
	s, err := sqlstore.New(f.db, sqlstore.Options{Table: f.table})
	if err != nil {
		t.Fatal(err)
	}
	f.s = s
	t.Cleanup(func() {
		testdb.DropTable(t, f.db, s.Tables()...)
	})
	return f
}

func (f *fixture) run(args ...string) result {
	f.t.Helper()
	return runCtl(f.t, nil, append([]string{"-dsn", f.dsn, "-table", f.table}, args...)...)
}

var (
	timeRE   = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	ageRE    = regexp.MustCompile(`<1s|\b(\d+h)?(\d+m)?\d+(\.\d+)?(s|ms|µs)\b`)
	spacesRE = regexp.MustCompile(` {2,}`)
)

// normalize makes a run's output comparable across runs and databases:
// event ids become E1…, times <time>, ages <age>, and the table <table>;
// runs of spaces (tabwriter's alignment, which depends on those widths)
// become two.
func (f *fixture) normalize(r result) string {
	s := fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
	for id, name := range f.ids {
		s = strings.ReplaceAll(s, id, name)
	}
	s = strings.ReplaceAll(s, f.table, "<table>")
	s = timeRE.ReplaceAllString(s, "<time>")
	s = ageRE.ReplaceAllString(s, "<age>")
	return spacesRE.ReplaceAllString(s, "  ")
}

// golden compares r with testdata/name.golden.
func (f *fixture) golden(name string, r result) {
	f.t.Helper()
	got := f.normalize(r)
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		f.t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got != string(want) {
		f.t.Errorf("%s: output differs from %s\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

// seed writes seven events in known states through the store:
//
//	E1 order.created  DEAD (card declined)
//	E2 order.created  split: billing dead
//	E3 order.paid     split: mailer retrying, due in 2h
//	E4 user.created   RETRY, due in 1h
//	E5 order.created  NEW, due now
//	E6 order.paid     DONE
//	E7 order.created  split: billing dead, mailer dead
func (f *fixture) seed() {
	t, s, ctx := f.t, f.s, context.Background()
	reg, err := s.SyncSubscriptions(ctx, []driver.SubscriptionInfo{
		{Name: "billing", Types: []string{"order.created"}},
		{Name: "mailer"},
	})
	if err != nil {
		t.Fatal(err)
	}
	v := reg.Version
	types := []string{"order.created", "order.created", "order.paid", "user.created", "order.created", "order.paid", "order.created"}
	var ids []string
	for i, typ := range types {
		r := driver.Row{ID: outbox.NewID(), Type: typ, AggregateType: "order", AggregateID: fmt.Sprint(i + 1),
			Payload: fmt.Appendf(nil, `{"n":%d,"email":"someone@example.com"}`, i+1), PayloadJSON: true, OccurredAt: time.Now()}
		if err := s.Insert(ctx, s.DB(), &r, "", 0); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
		f.ids[r.ID] = fmt.Sprintf("E%d", i+1)
	}
	time.Sleep(10 * time.Millisecond)
	rows, err := s.Claim(ctx, driver.ClaimRequest{Owner: "seed", Limit: 10, Lease: time.Minute})
	if err != nil || len(rows) != len(ids) {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	must := func(ok bool, err error) {
		t.Helper()
		if err != nil || !ok {
			t.Fatalf("seed: %v, %v", ok, err)
		}
	}
	must(s.MarkDead(ctx, "seed", ids[0], "permanent: card declined"))
	must(splitOne(ctx, s, "seed", ids[1], []driver.DeliveryWrite{{Subscription: "billing", Status: outbox.StatusDead, Attempts: 5, Error: "timeout talking to billing"}}, v))
	must(splitOne(ctx, s, "seed", ids[2], []driver.DeliveryWrite{{Subscription: "mailer", Status: outbox.StatusRetry, Attempts: 1, Delay: 2 * time.Hour, Error: "smtp 451 try later"}}, v))
	must(s.MarkRetry(ctx, "seed", ids[3], time.Hour, "db down"))
	if err := s.Release(ctx, "seed", ids[4:5], 0); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkDone(ctx, "seed", ids[5:6], v); n != 1 || err != nil {
		t.Fatalf("mark done: %d, %v", n, err)
	}
	must(splitOne(ctx, s, "seed", ids[6], []driver.DeliveryWrite{
		{Subscription: "billing", Status: outbox.StatusDead, Attempts: 5, Error: "timeout talking to billing"},
		{Subscription: "mailer", Status: outbox.StatusDead, Attempts: 3, Error: "mailbox full"},
	}, v))
}

func (f *fixture) id(name string) string {
	for id, n := range f.ids {
		if n == name {
			return id
		}
	}
	f.t.Fatalf("no event %s", name)
	return ""
}

// TestCommands runs every command against each database and compares the
// output with the same golden files: the three databases must agree.
func TestCommands(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			f.golden("migrate_status_before", f.run("migrate", "status"))
			f.golden("migrate_up", f.run("migrate", "up"))
			f.golden("migrate_up_again", f.run("migrate", "up"))
			f.golden("migrate_status", f.run("migrate", "status"))
			f.seed()

			f.golden("stats", f.run("stats"))
			f.golden("dead_list", f.run("dead", "list"))
			f.golden("dead_list_sub", f.run("dead", "list", "-sub", "billing"))
			f.golden("dead_list_error", f.run("dead", "list", "-error", "declined"))
			f.golden("dead_list_type", f.run("dead", "list", "-type", "order.created", "-since", "1h", "-until", "2099-01-01T00:00:00Z"))
			f.golden("dead_list_future", f.run("dead", "list", "-since", "2099-01-01T00:00:00Z"))
			f.golden("dead_show", f.run("dead", "show", f.id("E7")))
			f.golden("dead_show_payload", f.run("dead", "show", f.id("E1"), "-payload"))
			f.golden("dead_show_unknown", f.run("dead", "show", "nope"))
			f.golden("peek", f.run("peek"))
			f.golden("replay_all_unconfirmed", f.run("dead", "replay"))
			f.golden("replay_dry_run", f.run("dead", "replay", "-dry-run"))

			start := time.Now()
			f.golden("replay_sub_rate", f.run("dead", "replay", "-sub", "billing", "-rate", "2"))
			if el := time.Since(start); el < 900*time.Millisecond {
				t.Errorf("replay of 2 dead letters at -rate 2 took %v; want ≥ 1s", el)
			}
			f.golden("replay_again", f.run("dead", "replay", "-sub", "billing"))
			f.golden("replay_again_json", f.run("dead", "replay", "-sub", "billing", "-json"))
			f.golden("stats_after_replay", f.run("stats"))
			f.golden("peek_after_replay", f.run("peek", "-limit", "3"))

			f.golden("purge_unconfirmed", f.run("dead", "purge", "-sub", "mailer"))
			f.golden("purge_sub", f.run("dead", "purge", "-sub", "mailer", "-yes"))
			f.golden("purge_id", f.run("dead", "purge", f.id("E1"), "-yes"))
			f.golden("purge_nothing", f.run("dead", "purge", "-yes"))
			f.golden("dead_show_purged", f.run("dead", "show", f.id("E1")))
			f.golden("dead_show_after_purge", f.run("dead", "show", f.id("E7")))

			f.golden("pause", f.run("pause", "billing"))
			f.golden("pause_unknown", f.run("pause", "nobody"))
			f.golden("stats_paused", f.run("stats"))
			f.golden("resume", f.run("resume", "billing"))

			f.golden("cleanup_dry_run", f.run("cleanup", "-older", "0s", "-dry-run"))
			f.golden("cleanup_unconfirmed", f.run("cleanup", "-older", "0s"))
			f.golden("cleanup", f.run("cleanup", "-older", "0s", "-yes"))
			f.golden("cleanup_again", f.run("cleanup", "-older", "0s", "-dry-run"))

			// JSON: one document each, checked by decoding.
			var st statsJSON
			f.decode(f.run("-json", "stats"), &st)
			if st.Total.New != 1 || st.Total.Retry != 1 || st.Total.Split != 3 || st.Total.Done != 0 || len(st.Types) != 3 || len(st.Subscriptions) != 2 {
				t.Errorf("stats -json: %+v", st)
			}
			var dl struct{ Dead []deadJSON }
			f.decode(f.run("dead", "list", "-json"), &dl)
			if len(dl.Dead) != 0 {
				t.Errorf("dead list -json: %+v", dl)
			}
			var rec recordJSON
			f.decode(f.run("dead", "show", "-json", "-payload", f.id("E3")), &rec)
			if rec.Status != "split" || rec.Payload == nil || !strings.Contains(*rec.Payload, `"n":3`) || len(rec.Deliveries) != 1 {
				t.Errorf("dead show -json: %+v", rec)
			}
			var due struct{ Due []dueJSON }
			f.decode(f.run("peek", "-json"), &due)
			if len(due.Due) != 5 {
				t.Errorf("peek -json: %d rows, want 5: %+v", len(due.Due), due)
			}
		})
	}
}

// TestOrderingCommands: an event dead for an Ordered subscription blocks
// its key; blocked-keys lists it (the ordered subscriptions named, or
// read from the subscriptions table), skip counts without -yes and gives
// up with it, and the key is no longer blocked. The three databases
// agree.
func TestOrderingCommands(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate: %+v", r)
			}
			ctx, s := context.Background(), f.s
			if _, err := s.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "billing"}}); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for i, key := range []string{"order:9", "order:9", "order:9", "order:10"} {
				r := driver.Row{ID: outbox.NewID(), Type: "order.created", AggregateType: "order", AggregateID: strings.TrimPrefix(key, "order:"),
					OrderingKey: key, Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
				owner := ""
				if i == 0 {
					owner = "seed"
				}
				if _, _, err := s.InsertOrdered(ctx, s.DB(), &r, owner, time.Minute, driver.OrderFilter{Block: []string{"billing"}}); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, r.ID)
				f.ids[r.ID] = fmt.Sprintf("E%d", i+1)
			}
			if ok, err := s.MarkDead(ctx, "seed", ids[0], "permanent: card declined"); !ok || err != nil {
				t.Fatalf("mark dead: %v %v", ok, err)
			}

			f.golden("blocked_keys_unordered", f.run("blocked-keys"))
			f.golden("blocked_keys", f.run("blocked-keys", "-ordered", "billing"))
			// Registered as Ordered, billing needs no -ordered.
			if _, err := s.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "billing", Order: 1}}); err != nil {
				t.Fatal(err)
			}
			f.golden("blocked_keys", f.run("blocked-keys"))
			f.golden("blocked_keys_two_lists", f.run("blocked-keys", "-skip-dead", "billing", "-ordered", "other"))
			f.golden("blocked_keys_after", f.run("blocked-keys", "-ordered", "billing", "-after", "order:9"))
			var bk struct {
				Blocked []blockedJSON
				Next    string
			}
			f.decode(f.run("blocked-keys", "-ordered", "billing", "-limit", "1", "-json"), &bk)
			if len(bk.Blocked) != 1 || bk.Blocked[0].Key != "order:9" || bk.Blocked[0].EventID != ids[0] || bk.Blocked[0].Waiting != 2 || bk.Next != "order:9" {
				t.Errorf("blocked-keys -json: %+v", bk)
			}
			f.golden("skip_unconfirmed", f.run("skip", ids[0], ids[1]))
			f.golden("skip", f.run("skip", ids[0], ids[1], "-yes"))
			f.golden("skip_again", f.run("skip", ids[0], "-yes"))
			f.golden("skip_no_id", f.run("skip"))
			f.golden("blocked_keys_after_skip", f.run("blocked-keys", "-ordered", "billing"))
			rec, err := s.Inspect(ctx, ids[0])
			if err != nil || rec.Status != outbox.StatusDone || rec.LastError != "permanent: card declined" {
				t.Errorf("skipped event: %+v %v", rec, err)
			}
		})
	}
}

func (f *fixture) decode(r result, v any) {
	f.t.Helper()
	if r.code != 0 {
		f.t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	if err := dec.Decode(v); err != nil {
		f.t.Fatalf("decode %q: %v", r.stdout, err)
	}
	if dec.More() {
		f.t.Errorf("more than one JSON document: %q", r.stdout)
	}
}

// TestUsageAndSecrets needs no database: usage errors exit 2, and a
// password in the DSN is never printed, from -dsn or DATABASE_URL.
func TestUsageAndSecrets(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, exitUsage},
		{[]string{"bogus"}, exitUsage},
		{[]string{"-nope"}, exitUsage},
		{[]string{"migrate"}, exitUsage},
		{[]string{"migrate", "sideways"}, exitUsage},
		{[]string{"dead", "show"}, exitUsage},
		{[]string{"pause"}, exitUsage},
		{[]string{"-dsn", "sqlite:x.db", "dead", "list", "-since", "yesterday"}, exitUsage},
		{[]string{"stats"}, exitUsage}, // no database
		{[]string{"-dsn", "oracle://x", "stats"}, exitUsage},
		{[]string{"-h"}, exitOK},
		{[]string{"help"}, exitOK},
		{[]string{"-dsn", "sqlite:" + filepath.Join(t.TempDir(), "missing.db"), "stats"}, exitError},
	} {
		r := runCtl(t, nil, tc.args...)
		if r.code != tc.code {
			t.Errorf("outboxctl %q: exit %d, want %d; stderr %s", tc.args, r.code, tc.code, r.stderr)
		}
	}
	if r := runCtl(t, nil, "-h"); !strings.Contains(r.stdout, "Exit codes:") {
		t.Errorf("-h does not document the exit codes on stdout: %s", r.stdout)
	}
	for _, dsn := range []string{
		"mysql://root:s3cr%21et@127.0.0.1:1/test",
		"root:s3cr!et@tcp(127.0.0.1:1)/test",
		"postgres://postgres:s3cr!et@127.0.0.1:1/test?sslmode=disable",
		"mysql://root:s3cr!et@127.0.0.1:1/test?bogus%zz",
	} {
		for _, r := range []result{
			runCtl(t, nil, "-dsn", dsn, "stats"),
			runCtl(t, []string{"DATABASE_URL=" + dsn}, "dead", "list"),
		} {
			if r.code == 0 || strings.Contains(r.stdout+r.stderr, "s3cr") {
				t.Errorf("DSN %s: exit %d, output shows the password or is no error:\n%s%s", dsn, r.code, r.stdout, r.stderr)
			}
		}
	}
}

// partitions status and maintain on MariaDB; a clear refusal elsewhere.
func TestPartitionsCommand(t *testing.T) {
	f := newFixture(t, "mysql")
	if r := f.run("migrate", "up"); r.code != 0 {
		t.Fatalf("migrate up: %+v", r)
	}
	if r := f.run("partitions", "status"); r.code != exitError || !strings.Contains(r.stderr, "not partitioned") {
		t.Fatalf("status of a plain table: %+v; want exit 1 saying it is not partitioned", r)
	}
	r := f.run("-json", "partitions", "maintain", "-create", "-ahead", "1")
	if r.code != 0 {
		t.Fatalf("maintain -create: %+v", r)
	}
	var m maintainJSON
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil || !m.Created || len(m.Added) != 0 {
		t.Fatalf("maintain -create = %s (%v); want created, nothing more to add", r.stdout, err)
	}
	today := time.Now().UTC()
	r = f.run("partitions", "status")
	for _, want := range []string{"p" + today.Format("20060102"), "p" + today.AddDate(0, 0, 1).Format("20060102"), "pmax"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("status = %+v; want %s listed", r, want)
		}
	}
	r = f.run("partitions", "maintain", "-ahead", "3")
	if r.code != 0 || !strings.Contains(r.stdout, "added 2: p"+today.AddDate(0, 0, 2).Format("20060102")) {
		t.Fatalf("maintain -ahead 3 = %+v; want two days added", r)
	}
	// Dropping partitions needs -yes; a negative retention is a usage error.
	if r := f.run("partitions", "maintain", "-retention", "168h"); r.code != exitUsage || !strings.Contains(r.stderr, "add -yes") {
		t.Fatalf("maintain -retention without -yes = %+v; want exit 2 asking for -yes", r)
	}
	if r := f.run("partitions", "maintain", "-retention", "-1h", "-yes"); r.code != exitUsage || !strings.Contains(r.stderr, "want ≥ 0") {
		t.Fatalf("maintain -retention -1h = %+v; want exit 2", r)
	}
	if r := f.run("partitions", "maintain", "-retention", "168h", "-yes"); r.code != 0 || !strings.Contains(r.stdout, "dropped 0") {
		t.Fatalf("maintain -retention 168h -yes = %+v; want nothing to drop", r)
	}
	sf := newFixture(t, "sqlite")
	sf.run("migrate", "up")
	if r := sf.run("partitions", "status"); r.code != exitError || !strings.Contains(r.stderr, "only MySQL and MariaDB") {
		t.Fatalf("status on SQLite: %+v; want exit 1 naming MySQL and MariaDB", r)
	}
}

// splitOne is Split of one event.
func splitOne(ctx context.Context, st driver.DeliveryStore, owner, id string, writes []driver.DeliveryWrite, registry int64) (bool, error) {
	held, err := st.Split(ctx, owner, []driver.EventSplit{{EventID: id, Writes: writes}}, registry)
	return err == nil && len(held) == 1 && held[0], err
}
