package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// binary builds outboxctl once: the tests run the real program.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outboxctl")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "outboxctl")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

type result struct {
	code           int
	stdout, stderr string
}

func ctl(t *testing.T, dsn, table string, args ...string) result {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"-dsn", dsn, "-table", table}, args...)...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

// The built binary against each database: migrations, stats with each
// subscription's lag, dead letters listed, shown and replayed (dry run
// first), pause and resume, the exit codes, and no password in errors.
func TestOutboxctl(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			var db *sqlx.DB
			var dsn string
			switch name {
			case "sqlite":
				path := filepath.Join(t.TempDir(), "ctl.db")
				dsn = "sqlite:" + path
				db = sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(path))
				t.Cleanup(func() { db.Close() })
			case "mysql":
				db, dsn = testdb.MySQL(t), testdb.MySQLDSN()
			case "postgres":
				db, dsn = testdb.Postgres(t), testdb.PostgresDSN()
			}
			st := testdb.Store(t, db)
			table := strings.Trim(st.Table(), "`\"")
			ctx := context.Background()

			// Two events: "ok" delivers both, "picky" refuses both.
			ob, err := outbox.New(st, outbox.Config{PollInterval: 10 * time.Millisecond, SkipRecent: -1})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("ok", func(context.Context, outbox.Event) error { return nil }, "OrderPlaced")
			ob.Handle("picky", func(context.Context, outbox.Event) error {
				return outbox.Permanent(errors.New("schema mismatch"))
			}, "OrderPlaced")
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for i := range 2 {
				tx, err := outbox.BeginTx(ctx, db.DB, nil)
				if err != nil {
					t.Fatal(err)
				}
				id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", AggregateType: "order", AggregateID: fmt.Sprint(i + 1), JSON: []byte(`{"secret":"payload"}`)})
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			deadline := time.Now().Add(15 * time.Second)
			for {
				dls, err := st.FindDead(ctx, outbox.DeadFilter{Subscription: "picky"})
				if err != nil {
					t.Fatal(err)
				}
				if len(dls) == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d dead deliveries; want 2", len(dls))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := ob.Close(ctx); err != nil {
				t.Fatal(err)
			}

			r := ctl(t, dsn, table, "-json", "migrate", "status")
			var migs []migration
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &migs) != nil || len(migs) < 2 || !migs[0].Applied || !migs[len(migs)-1].Applied {
				t.Fatalf("migrate status: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if r := ctl(t, dsn, table, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "002_subscriptions") {
				t.Fatalf("migrate up: %d %s %s", r.code, r.stdout, r.stderr)
			}

			r = ctl(t, dsn, table, "-json", "stats")
			var stats statsDoc
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &stats) != nil {
				t.Fatalf("stats: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if stats.Events.Split != 2 {
				t.Errorf("stats: %d split events; want 2", stats.Events.Split)
			}
			lag := map[string]subDoc{}
			for _, s := range stats.Subscriptions {
				lag[s.Name] = s
			}
			if lag["picky"].Dead != 2 || lag["ok"].Dead != 0 || lag["ok"].Pending != 0 {
				t.Errorf("stats subscriptions: %+v", stats.Subscriptions)
			}
			if r := ctl(t, dsn, table, "stats"); r.code != 0 || !strings.Contains(r.stdout, "SUBSCRIPTION") || !strings.Contains(r.stdout, "picky") {
				t.Errorf("stats as text: %d\n%s", r.code, r.stdout)
			}

			r = ctl(t, dsn, table, "-json", "dead", "list", "-subscription", "picky", "-error", "schema")
			var dead []deadDoc
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &dead) != nil || len(dead) != 2 || dead[0].ID != ids[0] || dead[0].LastError != "schema mismatch" {
				t.Fatalf("dead list: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if strings.Contains(r.stdout, "secret") {
				t.Error("dead list shows the payload")
			}
			if r := ctl(t, dsn, table, "-json", "dead", "list", "-subscription", "ok"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
				t.Errorf("dead list of a healthy subscription: %d %q", r.code, r.stdout)
			}

			r = ctl(t, dsn, table, "-json", "dead", "show", ids[0])
			var show showDoc
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &show) != nil || show.Payload != nil || len(show.Deliveries) == 0 {
				t.Fatalf("dead show: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if r := ctl(t, dsn, table, "dead", "show", ids[0], "-payload"); !strings.Contains(r.stdout, `"secret":"payload"`) {
				t.Errorf("dead show -payload: %s", r.stdout)
			}
			if r := ctl(t, dsn, table, "dead", "show", "no-such-id"); r.code != exitNoMatch {
				t.Errorf("dead show of a missing id: exit %d; want %d", r.code, exitNoMatch)
			}

			r = ctl(t, dsn, table, "-json", "dead", "replay", "-subscription", "picky", "-dry-run")
			var rep replayDoc
			if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Count != 2 || !rep.DryRun || len(rep.FirstIDs) != 2 {
				t.Fatalf("dead replay -dry-run: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if dls, _ := st.FindDead(ctx, outbox.DeadFilter{Subscription: "picky"}); len(dls) != 2 {
				t.Fatal("a dry run replayed")
			}
			if r := ctl(t, dsn, table, "dead", "replay", "-subscription", "picky"); r.code != 0 || !strings.Contains(r.stdout, "replayed 2") {
				t.Fatalf("dead replay: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if r := ctl(t, dsn, table, "dead", "replay", "-subscription", "picky"); r.code != exitNoMatch {
				t.Errorf("a second replay: exit %d; want %d (nothing dead)", r.code, exitNoMatch)
			}

			if r := ctl(t, dsn, table, "pause", "picky"); r.code != 0 || !strings.Contains(r.stdout, "picky paused") {
				t.Errorf("pause: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if r := ctl(t, dsn, table, "resume", "picky"); r.code != 0 {
				t.Errorf("resume: %d %s", r.code, r.stderr)
			}
			if r := ctl(t, dsn, table, "pause", "nobody"); r.code != exitNoMatch {
				t.Errorf("pause of an unknown subscription: exit %d; want %d", r.code, exitNoMatch)
			}
			if r := ctl(t, dsn, table, "cleanup", "-older-than", "1h"); r.code != exitNoMatch || !strings.Contains(r.stderr, "-confirm") {
				t.Errorf("cleanup without -confirm: %d %s", r.code, r.stderr)
			}
			if r := ctl(t, dsn, table, "-json", "cleanup", "-older-than", "1h", "-confirm"); r.code != 0 || !strings.Contains(r.stdout, `"deleted"`) {
				t.Errorf("cleanup: %d %s %s", r.code, r.stdout, r.stderr)
			}
			if r := ctl(t, dsn, table, "frobnicate"); r.code != exitUsage {
				t.Errorf("unknown command: exit %d; want %d", r.code, exitUsage)
			}
		})
	}
}

// A DSN's password never reaches the output, even when the connection
// fails.
func TestPasswordNeverPrinted(t *testing.T) {
	for _, dsn := range []string{"mysql://app:hunter2secret@127.0.0.1:1/shop", "postgres://app:hunter2secret@127.0.0.1:1/shop?connect_timeout=1"} {
		r := ctl(t, dsn, "outbox_event", "stats")
		if r.code != exitFailed {
			t.Errorf("%s: exit %d; want %d", strings.SplitN(dsn, ":", 2)[0], r.code, exitFailed)
		}
		if strings.Contains(r.stdout+r.stderr, "hunter2secret") {
			t.Errorf("the password was printed: %s", r.stderr)
		}
	}
	if r := ctl(t, "", "outbox_event", "stats"); r.code != exitFailed || !strings.Contains(r.stderr, "DATABASE_URL") {
		t.Errorf("no DSN: %d %s", r.code, r.stderr)
	}
}
