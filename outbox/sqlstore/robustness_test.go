package sqlstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// poison is a row damaged by hand in a way the database accepts but the
// engine cannot read.
type poison struct {
	set    string // SQL assignments for UPDATE … SET
	column string // the column the reason must name ("" for an unknown status)
}

// poisons are, per database, the damage an operator or a buggy migration
// can leave in the table.
var poisons = map[string][]poison{
	"mysql": {
		{"occurred_at = '0000-00-00 00:00:00'", "occurred_at"},
		{"created_at = '0000-00-00 00:00:00'", "created_at"},
		{"payload_json = 5", "payload_json"},
		{"status = 7", ""},
	},
	"postgres": {
		{"occurred_at = 'infinity'", "occurred_at"},
		{"created_at = '-infinity'", "created_at"},
		{"status = 7", ""},
	},
	"sqlite": {
		{"occurred_at = 'yesterday'", "occurred_at"},
		{"created_at = 'not a time'", "created_at"},
		{"payload_json = 5", "payload_json"},
		{"status = 7", ""},
	},
}

// countingStore counts claims and the rows they return.
type countingStore struct {
	*sqlstore.Store
	claims, claimed atomic.Int64
}

func (s *countingStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	rows, err := s.Store.Claim(ctx, req)
	s.claims.Add(1)
	s.claimed.Add(int64(len(rows)))
	return rows, err
}

// backlogMetrics closes unknown at the first Backlog sample that counts a
// row of unknown status.
type backlogMetrics struct {
	outbox.NopMetrics
	once    sync.Once
	unknown chan struct{}
}

func (m *backlogMetrics) Backlog(s outbox.Stats) {
	if s.Unknown > 0 {
		m.once.Do(func() { close(m.unknown) })
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// One unreadable row must not stop the poller: rows damaged in every way
// the database lets through sit at the head of the due index next to 100
// healthy events that only the poller can deliver. All 100 are delivered,
// each damaged row goes DEAD once with a reason naming its column, a row of
// unknown status is counted in Stats, and the poller does not spin.
func TestPoisonRowsDoNotStopThePoller(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if name == "mysql" {
				// Zero dates need a lax sql_mode, as in a table written by
				// an old application or restored from a dump.
				if _, err := conn.ExecContext(ctx, "SET SESSION sql_mode = ''"); err != nil {
					t.Fatal(err)
				}
			}
			// The damaged rows are the oldest: every claim meets them first.
			var bad []string
			for _, p := range poisons[name] {
				id := outbox.NewID()
				tx, err := db.Beginx()
				if err != nil {
					t.Fatal(err)
				}
				row := &driver.Row{ID: id, Type: "Poison", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
				if err := st.Insert(ctx, tx, row, "", 0); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				q := db.Rebind("UPDATE " + st.Table() + " SET " + p.set + " WHERE id = ?")
				if _, err := conn.ExecContext(ctx, q, id); err != nil {
					t.Fatalf("%s: %v", p.set, err)
				}
				bad = append(bad, id)
			}
			// 100 healthy events that need the poller: written free, as by
			// an instance that crashed or had the hot path off.
			publisher, err := outbox.New(st, outbox.Config{DisableHotPath: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			const n = 100
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			envs := make([]outbox.Envelope, n)
			for i := range envs {
				envs[i] = outbox.Envelope{Type: "Healthy", JSON: []byte(`{"ok":true}`)}
			}
			if _, err := publisher.PublishAllTx(ctx, tx, envs...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}

			logs := &syncBuf{}
			cs := &countingStore{Store: st}
			sampled := &backlogMetrics{unknown: make(chan struct{})}
			ob, err := outbox.New(cs, outbox.Config{
				PollInterval: 10 * time.Millisecond, PollMaxInterval: 20 * time.Millisecond, PollBatchSize: 10,
				SkipRecent: -1, StatsInterval: 20 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(logs, nil)), Metrics: sampled,
			})
			if err != nil {
				t.Fatal(err)
			}
			var delivered atomic.Int64
			all := make(chan struct{})
			ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
				if ev.Type == "Poison" {
					t.Errorf("a damaged row was delivered: %s", ev.ID)
				}
				if delivered.Add(1) == n {
					close(all)
				}
				return nil
			})

			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-all:
			case <-time.After(20 * time.Second):
				t.Fatalf("%d of %d healthy events delivered past the damaged rows; logs:\n%s", delivered.Load(), n, tail(logs.String()))
			}
			claimsAtDelivery := cs.claims.Load()
			select { // the sampler reports the row of unknown status
			case <-sampled.unknown:
			case <-time.After(20 * time.Second):
				t.Fatal("no Backlog sample counted the row of unknown status")
			}
			if err := ob.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), "status this engine does not know") {
				t.Error("the row of unknown status was not reported in the log")
			}

			for i, p := range poisons[name] {
				rec, err := st.Inspect(ctx, bad[i])
				if err != nil {
					t.Fatalf("Inspect %s: %v", p.set, err)
				}
				if p.column == "" {
					if rec.Status != 7 {
						t.Errorf("%s: status %v; the engine must leave an unknown status alone", p.set, rec.Status)
					}
					continue
				}
				if rec.Status != outbox.StatusDead || !strings.Contains(rec.LastError, p.column) {
					t.Errorf("%s: status %v, last_error %q; want DEAD naming %s", p.set, rec.Status, rec.LastError, p.column)
				}
			}
			if got := strings.Count(logs.String(), "stored row cannot be decoded"); got != len(bad)-1 {
				t.Errorf("%d damaged rows buried; want each once (%d)", got, len(bad)-1)
			}
			if strings.Contains(logs.String(), "poll for due events") {
				t.Errorf("a poll failed; logs:\n%s", tail(logs.String()))
			}
			if extra := cs.claimed.Load() - int64(n+len(bad)-1); extra != 0 {
				t.Errorf("claims returned %d rows more than the %d delivered and buried: a row was claimed again", extra, n+len(bad)-1)
			}
			t.Logf("%d claims until all delivered, %d in all", claimsAtDelivery, cs.claims.Load())
			stats, err := st.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if stats.Unknown != 1 || stats.Done != n || stats.Dead != int64(len(bad)-1) || stats.Pending() != 0 {
				t.Fatalf("Stats %+v; want 1 unknown, %d done, %d dead, none pending", stats, n, len(bad)-1)
			}
		})
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

// Migrate fails with a clear error when another session holds the
// migration lock past ctx's deadline, instead of migrating unlocked.
func TestMigrateFailsWhenLockIsHeld(t *testing.T) {
	for _, name := range []string{"mysql", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			holder, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Close()
			lock := sqlstore.LockName(t, st, "txoutbox_migrate_")
			take, give := "SELECT GET_LOCK(?, 0)", "SELECT RELEASE_LOCK(?)"
			if name == "postgres" {
				take, give = "SELECT pg_advisory_lock(hashtext($1))", "SELECT pg_advisory_unlock(hashtext($1))"
			}
			if _, err := holder.ExecContext(ctx, take, lock); err != nil {
				t.Fatal(err)
			}
			defer holder.ExecContext(ctx, give, lock)
			wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			defer cancel()
			err = st.Migrate(wctx)
			if err == nil || !strings.Contains(err.Error(), "migration lock") {
				t.Fatalf("Migrate with the lock held elsewhere: %v; want an error about the migration lock", err)
			}
		})
	}
}

// Cleanup measures age on the database's clock: a row delivered a moment
// ago survives a retention of an hour whatever the application's clock
// says (the interface takes an age, not a time), and goes with a negative
// one.
func TestCleanupAgeOnDatabaseClock(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			id := outbox.NewID()
			tx, err := db.Beginx()
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Insert(ctx, tx, &driver.Row{ID: id, Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}, "me", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if n, err := st.MarkDone(ctx, "me", []string{id}, regNow(t, st)); err != nil || n != 1 {
				t.Fatalf("MarkDone = %d, %v", n, err)
			}
			if n, err := st.Cleanup(ctx, time.Hour, 10, false); err != nil || n != 0 {
				t.Fatalf("Cleanup(1h) of a fresh DONE row = %d, %v; want 0", n, err)
			}
			if n, err := st.Cleanup(ctx, -time.Minute, 10, false); err != nil || n != 1 {
				t.Fatalf("Cleanup(-1m) = %d, %v; want 1", n, err)
			}
		})
	}
}

// registering is a store whose SyncSubscriptions says when it starts.
type registering struct {
	*sqlstore.Store
	entered chan struct{} // closed at the first call
	once    sync.Once
}

func (r *registering) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	r.once.Do(func() { close(r.entered) })
	return r.Store.SyncSubscriptions(ctx, subs)
}

// Start registers the subscriptions in the database while the application
// may be inside a transaction that publishes. That transaction's next
// Publish must not wait for Start: on SQLite (one writer) Start's write
// waits for the transaction, and the two would hold each other until
// Start's write timed out (15 s) and Start failed.
func TestPublishDoesNotWaitForStart(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := &registering{Store: testdb.Store(t, db), entered: make(chan struct{})}
			ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("all", func(context.Context, outbox.Event) error { return nil })
			defer ob.Close(context.Background())
			ctx := context.Background()
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			env := outbox.Envelope{Type: "Signup", JSON: []byte(`{}`)}
			if _, err := ob.PublishTx(ctx, tx, env); err != nil {
				t.Fatal(err)
			}
			started := make(chan error, 1)
			go func() { started <- ob.Start(ctx) }()
			<-st.entered // Start is writing the subscriptions
			if _, err := ob.PublishTx(ctx, tx, env); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := <-started; err != nil {
				t.Fatalf("Start: %v", err)
			}
		})
	}
}
