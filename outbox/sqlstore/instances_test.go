package sqlstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Many instances on one table (issue 33, defect 4): engines with a short
// poll claim the events a publisher without subscriptions writes at a
// steady rate, their handlers slow enough that each holds a queue of
// leased events. While the load and some of the engines go on, the others
// are closed at once, each with a 5 s context, then the rest with the load
// stopped. Every event a handler acknowledged (returned nil for) before
// its engine's Close returned must be DONE afterwards: the DONE write of
// the last batch may not wait behind the claims of the other instances
// (on MariaDB their locking reads over the due index held every entry
// they passed, the leased events of the others included, until they
// committed, and the DONE of those events queued behind one claim after
// another, for seconds).
func TestManyInstancesCloseLeavesNoAcknowledgedEventUndone(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			engines, perTx, pause := 48, 100, 20*time.Millisecond
			if name == "sqlite" {
				// One writer at a time, whose busy handler is not fair:
				// fewer engines, a lighter load.
				engines, perTx, pause = 4, 10, 50*time.Millisecond
			}
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			table := st.Table()
			var mu sync.Mutex
			acked := map[string]int{} // id → engine whose handler returned nil
			handler := func(i int) outbox.Handler {
				return func(ctx context.Context, ev outbox.Event) error {
					select { // a destination that takes a while
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(100 * time.Millisecond):
					}
					mu.Lock()
					acked[ev.ID] = i
					mu.Unlock()
					return nil
				}
			}
			var slowest slowestStatements
			defer func() { t.Logf("slowest engine writes: %s", slowest.String()) }()
			obs := make([]*outbox.Outbox, engines)
			for i := range obs {
				// A pool of its own, small, as a process of its own has.
				edb := db // SQLite: one file, one pool (it serialises writers anyway)
				if name != "sqlite" {
					edb = testdb.Open(t, name)
					edb.SetMaxOpenConns(2)
					edb.SetMaxIdleConns(2)
				}
				s, err := sqlstore.New(edb, sqlstore.Options{Table: unquote(table)})
				if err != nil {
					t.Fatal(err)
				}
				ob, err := outbox.New(s, outbox.Config{InstanceID: "e" + strconv.Itoa(i), PollInterval: 50 * time.Millisecond,
					PollMaxInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Metrics: &slowest})
				if err != nil {
					t.Fatal(err)
				}
				ob.Handle("bridge", handler(i), "Changed")
				if err := ob.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				obs[i] = ob
			}
			// The publisher subscribes to nothing: its events go to the
			// claims of the others.
			pub, err := outbox.New(st, outbox.Config{InstanceID: "pub", DisablePoller: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer pub.Close(context.Background())
			load, stopLoad := context.WithCancel(context.Background())
			defer stopLoad()
			var published atomic.Int64
			var wg sync.WaitGroup
			for p := range 2 {
				wg.Go(func() {
					for n := 0; load.Err() == nil; n++ {
						if err := publishMany(load, db, pub, perTx, p, n); err != nil && load.Err() == nil {
							t.Errorf("publish: %v", err)
							return
						}
						published.Add(int64(perTx))
						time.Sleep(pause) // steady, not flat out
					}
				})
			}
			time.Sleep(4 * time.Second)

			closeAll := func(obs []*outbox.Outbox) {
				var cw sync.WaitGroup
				for _, ob := range obs {
					cw.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						defer cancel()
						if err := ob.Close(ctx); err != nil {
							t.Logf("Close: %v", err)
						}
					})
				}
				cw.Wait()
			}
			// Half closed while the load and the other half go on.
			first := engines / 2
			closeAll(obs[:first])
			undone := notDone(t, db, table, &mu, acked, func(i int) bool { return i < first })
			stopLoad()
			wg.Wait()
			closeAll(obs[first:])
			all := notDone(t, db, table, &mu, acked, func(int) bool { return true })
			mu.Lock()
			n := len(acked)
			mu.Unlock()
			t.Logf("%d engines, %d events published, %d acknowledged; not DONE after Close: %d of the engines closed under load, %d in all", engines, published.Load(), n, undone, all)
			if undone > 0 || all > 0 {
				t.Errorf("acknowledged events left not DONE after Close: %d by the engines closed under load, %d in all (of %d acknowledged)", undone, all, n)
			}
		})
	}
}

// notDone counts the events acknowledged by the engines of which that are
// not DONE in table.
func notDone(t *testing.T, db *sqlx.DB, table string, mu *sync.Mutex, acked map[string]int, which func(int) bool) int {
	t.Helper()
	var ids []string
	if err := db.Select(&ids, `SELECT id FROM `+table+` WHERE status <> 1`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, id := range ids {
		if i, ok := acked[id]; ok && which(i) {
			n++
		}
	}
	return n
}

// publishMany commits k events through ob in one transaction.
func publishMany(ctx context.Context, db *sqlx.DB, ob *outbox.Outbox, k, p, n int) error {
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	envs := make([]outbox.Envelope, k)
	for i := range envs {
		envs[i] = outbox.Envelope{Type: "Changed", AggregateType: "Order", AggregateID: strconv.Itoa(p) + "-" + strconv.Itoa(n) + "-" + strconv.Itoa(i), JSON: []byte(`{}`)}
	}
	if _, err := ob.PublishAllTx(ctx, tx, envs...); err != nil {
		return err
	}
	return tx.Commit()
}

func unquote(table string) string { return table[1 : len(table)-1] }

// slowestStatements keeps the longest time of each engine write, for the
// log.
type slowestStatements struct {
	outbox.NopMetrics
	mu  sync.Mutex
	max map[string]time.Duration
}

func (s *slowestStatements) Statement(name string, _ int, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max == nil {
		s.max = map[string]time.Duration{}
	}
	s.max[name] = max(s.max[name], took)
}

func (s *slowestStatements) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.max)
}
