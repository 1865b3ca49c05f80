package sqlstore_test

import (
	"context"
	"database/sql"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Close keeps to its context when the database stops answering: three
// events are delivered during Close, whose DONE write then waits on a
// database that does not answer (MySQL, PostgreSQL: a proxy that holds
// every byte; SQLite: another connection holding the write lock). Close,
// given 2 s, returns well before the engine's 15 s store timeout (on
// MySQL, with an error if it left a part inside a COMMIT the driver cannot
// cut short), and nothing is lost: the events, still leased to the closed instance, go to
// the next instance once the lease has run out.
func TestCloseReturnsInTimeWhenTheDatabaseStalls(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			closing, stall, restore := st, func() {}, func() {}
			switch name {
			case "sqlite":
				var lock *sql.Tx
				stall = func() {
					var err error
					if lock, err = db.BeginTx(context.Background(), nil); err != nil { // IMMEDIATE: takes the write lock
						t.Fatal(err)
					}
					if _, err := lock.Exec(`CREATE TABLE IF NOT EXISTS stall_lock (x INTEGER)`); err != nil {
						t.Fatal(err)
					}
				}
				restore = func() { lock.Rollback() }
			default:
				pdb, proxy := throughProxy(t, name)
				var err error
				if closing, err = sqlstore.New(pdb, sqlstore.Options{Table: strings.Trim(st.Table(), "`\"")}); err != nil {
					t.Fatal(err)
				}
				stall, restore = proxy.Stall, proxy.Restore
			}
			const lease = 3 * time.Second
			var mu sync.Mutex
			var first, next []string
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			ob, err := outbox.New(closing, outbox.Config{InstanceID: "closing", Workers: 1, Lease: lease, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Subscribe(outbox.Subscription{Name: "proj", Handler: func(ctx context.Context, ev outbox.Event) error {
				once.Do(func() {
					close(entered)
					<-release
				})
				mu.Lock()
				first = append(first, ev.ID)
				mu.Unlock()
				return nil
			}}); err != nil {
				t.Fatal(err)
			}
			if err := ob.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			var ids []string
			for i := range 3 {
				tx, err := outbox.BeginTx(context.Background(), db.DB, nil)
				if err != nil {
					t.Fatal(err)
				}
				id, err := ob.PublishTx(context.Background(), tx, outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: string(rune('a' + i)), JSON: []byte(`{}`)})
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			<-entered
			stall()
			close(release)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			err = ob.Close(ctx)
			took := time.Since(start)
			// On MySQL the stall may catch a COMMIT (the poller's claim,
			// say), which the driver cannot cut short: Close then says
			// which part it left inside it, and returns in time all the
			// same. Any other error is a failure.
			if err != nil && !(name == "mysql" && strings.Contains(err.Error(), "did not return: blocked in a database call")) {
				t.Errorf("Close: %v", err)
			}
			// 2 s of context, a grace period of 1 s for the writes, the
			// last release's own bound of 5 s (it stalls too), and what
			// the driver takes to give up a cancelled statement; the
			// engine's own bound would be 15 s per write.
			if took > 11*time.Second {
				t.Errorf("Close took %v with a 2 s context while the database stalled", took)
			}
			t.Logf("Close took %v", took)
			mu.Lock()
			if len(first) != len(ids) {
				t.Errorf("the closing instance delivered %d of %d events before its DONE write stalled", len(first), len(ids))
			}
			mu.Unlock()

			restore()
			startOrdered(t, st, outbox.Config{InstanceID: "next", Lease: lease, PollInterval: 50 * time.Millisecond},
				outbox.Subscription{Name: "proj", Handler: func(ctx context.Context, ev outbox.Event) error {
					mu.Lock()
					next = append(next, ev.ID)
					mu.Unlock()
					return nil
				}})
			waitUntil(t, 4*lease, "the next instance delivers the events whose DONE was never written", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(next) >= len(ids)
			})
			mu.Lock()
			defer mu.Unlock()
			got := slices.Sorted(slices.Values(next))
			if want := slices.Sorted(slices.Values(ids)); !slices.Equal(got, want) {
				t.Errorf("the next instance delivered %v; want %v", got, want)
			}
		})
	}
}
