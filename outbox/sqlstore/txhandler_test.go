package sqlstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// project is a Tx handler: it writes one effect row per delivery, in the
// delivery's transaction. The effects table has no unique key, so an
// effect applied twice shows as two rows.
func project(effects, instance string, after func(ev outbox.Event)) outbox.TxHandler {
	return func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+effects+` (event_id, instance) VALUES ('`+ev.ID+`', '`+instance+`')`); err != nil {
			return err
		}
		if after != nil {
			after(ev)
		}
		return nil
	}
}

func effectsTable(t *testing.T, db *sqlx.DB) string {
	name := testdb.TableName("effects")
	db.MustExec(`CREATE TABLE ` + name + ` (event_id VARCHAR(64) NOT NULL, instance VARCHAR(64) NOT NULL)`)
	t.Cleanup(func() { testdb.DropTable(t, db, name) })
	return name
}

func effectCount(t *testing.T, db *sqlx.DB, effects, id string) int {
	var n int
	if err := db.Get(&n, db.Rebind(`SELECT COUNT(*) FROM `+effects+` WHERE event_id = ?`), id); err != nil {
		t.Fatal(err)
	}
	return n
}

// zombieStore never renews leases: its instance loses its events to
// another after one lease, while its handler still runs.
type zombieStore struct{ *sqlstore.Store }

func (zombieStore) ExtendLeases(_ context.Context, _ string, ids []string, _ time.Duration) (int, error) {
	return len(ids), nil
}

// A Tx subscription's effect happens once although two instances run the
// delivery: the first's lease runs out while its transaction is open, the
// second takes the event over and commits; the first then finds the
// delivery recorded and rolls its effect back. (SQLite serialises writers:
// the takeover cannot overlap the first transaction there; the crash test
// covers it.)
func TestTxSubscriptionOnceAcrossTakeover(t *testing.T) {
	for _, name := range []string{"mysql", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			effects := effectsTable(t, db)
			ctx := context.Background()
			entered, release := make(chan string, 1), make(chan struct{})
			slow, err := outbox.New(zombieStore{st}, outbox.Config{Lease: 300 * time.Millisecond, DisablePoller: true, InstanceID: "slow"})
			if err != nil {
				t.Fatal(err)
			}
			if err := slow.Subscribe(outbox.Subscription{Name: "projection", Timeout: -1, Tx: project(effects, "slow", func(ev outbox.Event) {
				entered <- ev.ID
				<-release
			})}); err != nil {
				t.Fatal(err)
			}
			fast, err := outbox.New(st, outbox.Config{Lease: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond, SkipRecent: -1, InstanceID: "fast"})
			if err != nil {
				t.Fatal(err)
			}
			tookOver := make(chan string, 1)
			if err := fast.Subscribe(outbox.Subscription{Name: "projection", Tx: project(effects, "fast", func(ev outbox.Event) { tookOver <- ev.ID })}); err != nil {
				t.Fatal(err)
			}
			if err := slow.Start(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			id, err := slow.PublishTx(ctx, tx, outbox.Envelope{Type: "Projected", JSON: []byte(`{}`)})
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			wait := func(ch chan string, what string) {
				select {
				case got := <-ch:
					if got != id {
						t.Fatalf("%s: event %s; want %s", what, got, id)
					}
				case <-time.After(15 * time.Second):
					t.Fatalf("timed out waiting for %s", what)
				}
			}
			wait(entered, "the slow instance's handler")
			if err := fast.Start(ctx); err != nil {
				t.Fatal(err)
			}
			wait(tookOver, "the takeover")
			// The takeover's transaction commits after its handler
			// returns: wait for its effect.
			deadline := time.Now().Add(15 * time.Second)
			for effectCount(t, db, effects, id) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the takeover's effect never committed")
				}
				time.Sleep(5 * time.Millisecond)
			}
			close(release)
			if err := slow.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if err := fast.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if n := effectCount(t, db, effects, id); n != 1 {
				t.Fatalf("effect applied %d times; want exactly once", n)
			}
			var by string
			db.Get(&by, db.Rebind(`SELECT instance FROM `+effects+` WHERE event_id = ?`), id)
			if by != "fast" {
				t.Fatalf("the effect is %q's; want the instance that took over", by)
			}
			rec, err := st.Inspect(ctx, id)
			if err != nil || rec.Status != outbox.StatusDone {
				t.Fatalf("event: %v, %v; want DONE", rec.Status, err)
			}
		})
	}
}

const txCrashEvents = 5

// A Tx subscription's effect happens once across a SIGKILL, wherever it
// lands: with the handler's write made and its transaction open (the
// effect is rolled back with the process, and the survivor applies it),
// or after the transaction committed but before the event was marked
// DONE (the survivor finds the delivery recorded and does not apply it
// again).
func TestTxSubscriptionOnceAcrossCrash(t *testing.T) {
	for _, name := range testdb.Names {
		for _, when := range []string{"before-commit", "after-commit"} {
			t.Run(name+"/"+when, func(t *testing.T) {
				var db *sqlx.DB
				var dsn string
				switch name {
				case "sqlite":
					dsn = sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "crash.db"))
					db = sqlx.MustOpen("sqlite", dsn)
					t.Cleanup(func() { db.Close() })
				case "mysql":
					db, dsn = testdb.MySQL(t), testdb.MySQLDSN()
				case "postgres":
					db, dsn = testdb.Postgres(t), testdb.PostgresDSN()
				}
				st := testdb.Store(t, db)
				effects := effectsTable(t, db)
				table := strings.Trim(st.Table(), "`\"")

				cmd := exec.Command(os.Args[0], "-test.run=^TestTxCrashChild$", "-test.v")
				cmd.Env = append(os.Environ(), "TXOUTBOX_TXCRASH_CHILD="+strings.Join([]string{db.DriverName(), dsn, table, effects, when}, "|"))
				stdout, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				lines := bufio.NewScanner(stdout)
				ready := false
				for !ready && lines.Scan() {
					ready = lines.Text() == "READY"
				}
				if !ready {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatal("the child ended before it was ready to be killed")
				}
				if when == "after-commit" {
					// Every effect committed, no event marked DONE yet.
					deadline := time.Now().Add(20 * time.Second)
					for {
						var n int
						if err := db.Get(&n, `SELECT COUNT(*) FROM `+effects); err != nil {
							t.Fatal(err)
						}
						if n == txCrashEvents {
							break
						}
						if time.Now().After(deadline) {
							cmd.Process.Kill()
							cmd.Wait()
							t.Fatalf("%d of %d effects committed by the child", n, txCrashEvents)
						}
						time.Sleep(5 * time.Millisecond)
					}
				}
				if err := cmd.Process.Kill(); err != nil { // SIGKILL
					t.Fatal(err)
				}
				cmd.Wait()
				stats, err := st.Stats(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if stats.Pending() != txCrashEvents {
					t.Fatalf("after the crash: %+v; want %d pending", stats, txCrashEvents)
				}

				ob, err := outbox.New(st, outbox.Config{PollInterval: 20 * time.Millisecond, SkipRecent: -1, InstanceID: "survivor"})
				if err != nil {
					t.Fatal(err)
				}
				if err := ob.Subscribe(outbox.Subscription{Name: "projection", Tx: project(effects, "survivor", nil)}); err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				if err := ob.Start(ctx); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					s, err := st.Stats(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if s.Done == txCrashEvents {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("survivor: %+v; want %d DONE", s, txCrashEvents)
					}
					time.Sleep(10 * time.Millisecond)
				}
				if err := ob.Close(ctx); err != nil {
					t.Fatal(err)
				}
				var rows []struct {
					ID       string `db:"event_id"`
					N        int    `db:"n"`
					Instance string `db:"instance"`
				}
				if err := db.Select(&rows, `SELECT event_id, COUNT(*) AS n, MIN(instance) AS instance FROM `+effects+` GROUP BY event_id`); err != nil {
					t.Fatal(err)
				}
				if len(rows) != txCrashEvents {
					t.Fatalf("effects for %d events; want %d", len(rows), txCrashEvents)
				}
				wantBy := map[string]string{"before-commit": "survivor", "after-commit": "child"}[when]
				for _, r := range rows {
					if r.N != 1 || r.Instance != wantBy {
						t.Fatalf("event %s: effect applied %d times by %s; want once, by %s", r.ID, r.N, r.Instance, wantBy)
					}
				}
			})
		}
	}
}

// TestTxCrashChild is the process TestTxSubscriptionOnceAcrossCrash kills.
func TestTxCrashChild(t *testing.T) {
	spec := os.Getenv("TXOUTBOX_TXCRASH_CHILD")
	if spec == "" {
		t.Skip("only runs as TestTxSubscriptionOnceAcrossCrash's child process")
	}
	p := strings.SplitN(spec, "|", 5)
	db := sqlx.MustOpen(p[0], p[1])
	st, err := sqlstore.New(db, sqlstore.Options{Table: p[2]})
	if err != nil {
		t.Fatal(err)
	}
	cfg := outbox.Config{Lease: 500 * time.Millisecond, Workers: 1, DisablePoller: true, InstanceID: "child"}
	block := p[4] == "before-commit"
	if !block {
		// Deliveries commit, the DONE marks wait: the kill lands between.
		cfg.CompletionLinger, cfg.CompletionBatchSize = time.Hour, 1000
	}
	ob, err := outbox.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Subscribe(outbox.Subscription{Name: "projection", Timeout: -1, Tx: project(p[3], "child", func(outbox.Event) {
		if block {
			fmt.Println("READY")
			select {}
		}
	})}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range txCrashEvents {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Projected", JSON: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if !block {
		fmt.Println("READY")
	}
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {}
}

// sqlState and sqliteBusy stand for the errors PostgreSQL and SQLite
// return when they give up on a transaction (the classification reads
// only their codes).
type sqlState string

func (s sqlState) Error() string    { return "database gave up on the transaction: SQLSTATE " + string(s) }
func (s sqlState) SQLState() string { return string(s) }

type sqliteBusy struct{}

func (sqliteBusy) Error() string { return "database is locked (5) (SQLITE_BUSY)" }
func (sqliteBusy) Code() int     { return 5 }

// deadlockOf returns the error the database name reports for a deadlock
// (SQLite: a busy database).
func deadlockOf(name string) error {
	switch name {
	case "mysql":
		return &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	case "postgres":
		return sqlState("40P01")
	}
	return sqliteBusy{}
}

// A Tx subscription's transaction that the database gives up on (a
// deadlock: under load MySQL picks the record's INSERT after the handler
// succeeded) is run again, handler included, without spending an attempt:
// with MaxAttempts 1 the event is delivered, once, and never dead.
func TestTxSubscriptionRunsADeadlockedTransactionAgain(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			effects := effectsTable(t, db)
			var mu sync.Mutex
			runs := map[string]int{}
			ob := startOrdered(t, st, outbox.Config{}, outbox.Subscription{Name: "projection", MaxAttempts: 1, Tx: func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
				mu.Lock()
				runs[ev.ID]++
				first := runs[ev.ID] == 1
				mu.Unlock()
				if err := project(effects, "i", nil)(ctx, tx, ev); err != nil || !first {
					return err
				}
				// Its effect is written, then the transaction dies.
				return fmt.Errorf("project %s: %w", ev.ID, deadlockOf(name))
			}})
			id := publishInTx(t, ob, st, outbox.Envelope{Type: "Changed", JSON: []byte(`{}`)})
			waitUntil(t, 30*time.Second, "the event recorded delivered", func() bool {
				rec, err := st.Inspect(context.Background(), id)
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range rec.Deliveries {
					if d.Status == outbox.StatusDead {
						t.Fatalf("the delivery is dead (%s): the deadlock spent its only attempt", d.LastError)
					}
				}
				return rec.Status == outbox.StatusDone
			})
			if n := effectCount(t, db, effects, id); n != 1 {
				t.Errorf("%d effects committed; want 1 (the deadlocked transaction's rolled back)", n)
			}
			mu.Lock()
			defer mu.Unlock()
			if runs[id] != 2 {
				t.Errorf("the handler ran %d times; want 2", runs[id])
			}
		})
	}
}

// A Tx delivery is recorded only in the caller's turn with it: a call on
// the whole event after the event was split, or on a delivery whose
// failed attempts or owner changed since it was leased (a call that
// outlived its timeout or lease, whose outcome the engine has written,
// then leased the delivery again), records nothing, and its effect is
// rolled back (driver.ErrLeaseLost). The call in the current turn records
// it. make sim's seed 4282 found the stale call's commit letting the key's
// next event go to an ordered Tx subscription beside the retry.
func TestTxDeliveryRecordedOnlyInItsTurn(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			effects := effectsTable(t, db)
			ctx := context.Background()
			r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
			if err := st.Insert(ctx, db, &r, "a", time.Minute); err != nil {
				t.Fatal(err)
			}
			// Split, the delivery to s due: its turn on the whole event is
			// over.
			if ok, err := splitOne(ctx, st, "a", r.ID, []driver.DeliveryWrite{{Subscription: "s", Status: driver.StatusNew}}, regNow(t, st)); err != nil || !ok {
				t.Fatalf("Split = %v, %v", ok, err)
			}
			deliver := func(who string, at driver.TxTurn) (bool, error) {
				return st.DeliverInTx(ctx, who, at, r.ID, "s", func(tx outbox.DBTx) error {
					_, err := tx.ExecContext(ctx, db.Rebind(`INSERT INTO `+effects+` (event_id, instance) VALUES (?, ?)`), r.ID, who)
					return err
				})
			}
			want := func(what string, already bool, err error, wantErr error) {
				t.Helper()
				if already || !errors.Is(err, wantErr) {
					t.Fatalf("%s: already %v, %v; want %v", what, already, err, wantErr)
				}
				if n := effectCount(t, db, effects, r.ID); n != 0 {
					t.Fatalf("%s: %d effects committed; want none", what, n)
				}
			}
			already, err := deliver("a", driver.TxTurn{Whole: true})
			want("on the whole event after its split", already, err, driver.ErrLeaseLost)
			claim := func() {
				t.Helper()
				ds, err := st.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "a", Limit: 10, Lease: time.Minute, SkipRecent: -1}, []string{"s"}, driver.OrderFilter{})
				if err != nil || len(ds) != 1 {
					t.Fatalf("ClaimDeliveries = %d, %v; want the delivery", len(ds), err)
				}
			}
			claim() // attempts 0
			// The attempt fails (its outcome written), and the delivery is
			// leased again: the first call's turn is over.
			if ok, err := st.FailDelivery(ctx, "a", driver.DeliveryID{EventID: r.ID, Subscription: "s"}, driver.DeliveryWrite{Subscription: "s", Status: driver.StatusRetry, Attempts: 1, Error: "timeout"}); err != nil || !ok {
				t.Fatalf("FailDelivery = %v, %v", ok, err)
			}
			claim() // attempts 1
			already, err = deliver("a", driver.TxTurn{Attempts: 0})
			want("the first attempt's call after its failure was written", already, err, driver.ErrLeaseLost)
			already, err = deliver("b", driver.TxTurn{Attempts: 1})
			want("another instance's call", already, err, driver.ErrLeaseLost)
			if already, err = deliver("a", driver.TxTurn{Attempts: 1}); already || err != nil {
				t.Fatalf("the call in its turn: already %v, %v", already, err)
			}
			if n := effectCount(t, db, effects, r.ID); n != 1 {
				t.Fatalf("%d effects after the call in its turn; want 1", n)
			}
			if already, err = deliver("a", driver.TxTurn{Attempts: 1}); !already || err != nil {
				t.Fatalf("again after it was recorded: already %v, %v; want already", already, err)
			}
			rec, err := st.Inspect(ctx, r.ID)
			if err != nil || rec.Status != outbox.StatusDone {
				t.Fatalf("the event: %+v, %v; want DONE (its last delivery recorded)", rec.Status, err)
			}
		})
	}
}
