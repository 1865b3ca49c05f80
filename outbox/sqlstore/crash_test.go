package sqlstore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

const crashEvents = 50

// TestCrashRecovery kills a real process (this test binary, re-executed)
// with SIGKILL while it delivers committed events, and checks that another
// instance delivers every one of them once the dead instance's leases run
// out.
func TestCrashRecovery(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			var db *sqlx.DB
			var dsn, driver string
			switch name {
			case "sqlite":
				path := filepath.Join(t.TempDir(), "crash.db")
				dsn, driver = sqlstore.SQLiteDSN(path), "sqlite"
				db = sqlx.MustOpen(driver, dsn)
				t.Cleanup(func() { db.Close() })
			case "postgres":
				db, dsn, driver = testdb.Postgres(t), testdb.PostgresDSN(), "pgx"
			default:
				db, dsn, driver = testdb.MySQL(t), testdb.MySQLDSN(), "mysql"
			}
			st := testdb.Store(t, db)
			table := strings.Trim(st.Table(), "`\"")

			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
			cmd.Env = append(os.Environ(), "TXOUTBOX_CRASH_CHILD="+driver+"|"+dsn+"|"+table)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Wait until the child has committed every event and is in
			// the middle of delivering one.
			lines := bufio.NewScanner(stdout)
			var committed, delivering bool
			for !(committed && delivering) && lines.Scan() {
				committed = committed || lines.Text() == "COMMITTED"
				delivering = delivering || lines.Text() == "DELIVERING"
			}
			if !(committed && delivering) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("child ended before committing and delivering (committed %v, delivering %v)", committed, delivering)
			}
			if err := cmd.Process.Kill(); err != nil { // SIGKILL: no Close, no hand-back
				t.Fatal(err)
			}
			cmd.Wait()

			stats, err := st.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if stats.Pending() != crashEvents {
				t.Fatalf("after the crash: %+v, want %d pending", stats, crashEvents)
			}
			ob, err := outbox.New(st, outbox.Config{PollInterval: 20 * time.Millisecond, SkipRecent: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			seen := map[string]int{}
			all := make(chan struct{})
			ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				seen[ev.ID]++
				if len(seen) == crashEvents {
					close(all)
				}
				return nil
			})

			ob.Start(context.Background())
			select {
			case <-all:
			case <-time.After(30 * time.Second):
				t.Fatalf("survivor delivered %d of %d events", len(seen), crashEvents)
			}
			if err := ob.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			stats, _ = st.Stats(context.Background())
			if stats.Done != crashEvents {
				t.Fatalf("after recovery: %+v", stats)
			}
			for id, n := range seen {
				if n != 1 {
					t.Fatalf("survivor delivered %s %d times", id, n)
				}
			}
		})
	}
}

// TestCrashChild is the process TestCrashRecovery kills. It does nothing
// unless TXOUTBOX_CRASH_CHILD is set.
func TestCrashChild(t *testing.T) {
	spec := os.Getenv("TXOUTBOX_CRASH_CHILD")
	if spec == "" {
		t.Skip("only runs as TestCrashRecovery's child process")
	}
	parts := strings.SplitN(spec, "|", 3)
	driver := parts[0]
	db := sqlx.MustOpen(driver, parts[1])
	st, err := sqlstore.New(db, sqlstore.Options{Table: parts[2]})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(st, outbox.Config{Lease: 500 * time.Millisecond, Workers: 1, DisablePoller: true, ListenerTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	ob.Handle("all", func(ctx context.Context, _ outbox.Event) error {
		once.Do(func() { fmt.Println("DELIVERING") })
		select {}
	})

	ctx := context.Background()
	for i := range crashEvents {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Crash", JSON: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("COMMITTED")
	ob.Start(ctx)
	select {}
}
