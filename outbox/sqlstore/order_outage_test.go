package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// A database outage across instances keeps per-key order: three instances
// and twelve producers reach the database through a TCP proxy, which is
// cut (connections closed and refused, as a database that went away) or
// stalled (every byte held, as a network partition) for longer than the
// lease (3 s against 2 s) mid-run, then restored.
// Every committed event reaches the Ordered subscription, each key's
// events first delivered in commit order, never two of a key at once;
// events in flight at the cut may be delivered again. A publish whose
// COMMIT was cut has an unknown outcome: it is expected only if its row
// exists. SQLite has no connection to cut.
func TestOrderedThroughADatabaseOutage(t *testing.T) {
	const (
		instances = 3
		producers = 12
		keys      = 10
	)
	for _, c := range []struct{ name, outage string }{{"mysql", "cut"}, {"mysql", "stall"}, {"postgres", "cut"}, {"postgres", "stall"}} {
		name := c.name
		t.Run(name+"/"+c.outage, func(t *testing.T) {
			st := testdb.Store(t, testdb.Open(t, name))
			pdb, proxy := throughProxy(t, name)
			pst, err := sqlstore.New(pdb, sqlstore.Options{Table: strings.Trim(st.Table(), "`\"")})
			if err != nil {
				t.Fatal(err)
			}
			l := newKeyLog(t, -1) // how many is known after the run; duplicates are expected
			sub := outbox.Subscription{Name: "b", Order: outbox.Ordered, Handler: l.handle, Retry: outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond })}
			var obs []*outbox.Outbox
			for i := range instances {
				cfg := instance(i)
				cfg.Lease = 2 * time.Second
				obs = append(obs, startOrdered(t, pst, cfg, sub))
			}

			// Each producer publishes, key by key under the key's mutex,
			// until stop; a publish whose COMMIT failed is a "maybe".
			kmu := make([]sync.Mutex, keys)
			order := make([][]string, keys)
			maybe := map[string]bool{} // id → its COMMIT failed
			var omu sync.Mutex
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for p := range producers {
				wg.Go(func() {
					rnd := rand.New(rand.NewPCG(uint64(p), 8))
					for {
						select {
						case <-stop:
							return
						case <-time.After(2 * time.Millisecond):
						}
						k := rnd.IntN(keys)
						env := outbox.Envelope{ID: outbox.NewID(), Type: "Posted", AggregateType: "Acct", AggregateID: strconv.Itoa(k), JSON: []byte(`{}`)}
						kmu[k].Lock()
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						atCommit, err := publishWithin(ctx, pdb.DB, obs[rnd.IntN(instances)], env)
						cancel()
						if err == nil || atCommit {
							omu.Lock()
							order[k] = append(order[k], env.ID)
							maybe[env.ID] = err != nil
							omu.Unlock()
						}
						kmu[k].Unlock()
					}
				})
			}
			phase := func(d time.Duration) { time.Sleep(d) } // the workload's phases, not a wait for a signal
			phase(time.Second)
			pdb.SetMaxIdleConns(0) // the cut closes them anyway; do not hand out dead ones after
			if c.outage == "cut" {
				proxy.Cut()
			} else {
				proxy.Stall()
			}
			phase(3 * time.Second)
			proxy.Restore()
			pdb.SetMaxIdleConns(40)
			phase(time.Second)
			close(stop)
			wg.Wait()

			// The maybes that committed are expected; the others are not.
			want := make([][]string, keys)
			total := 0
			for k := range keys {
				for _, id := range order[k] {
					if maybe[id] {
						if _, err := st.Inspect(context.Background(), id); err != nil {
							continue
						}
					}
					want[k] = append(want[k], id)
				}
				total += len(want[k])
			}
			first := func() (map[string][]string, int, int) {
				l.mu.Lock()
				defer l.mu.Unlock()
				out, n, dups := map[string][]string{}, 0, 0
				for k, ids := range l.got {
					seen := map[string]bool{}
					for _, id := range ids {
						if seen[id] {
							dups++
							continue
						}
						seen[id] = true
						out[k] = append(out[k], id)
						n++
					}
				}
				return out, n, dups
			}
			deadline := time.Now().Add(60 * time.Second)
			for _, n, _ := first(); n < total; _, n, _ = first() {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d committed events delivered 60 s after the outage", n, total)
				}
				time.Sleep(20 * time.Millisecond)
			}
			firsts, n, dups := first()
			for k := range keys {
				if key := numberedKey(k); !slices.Equal(firsts[key], want[k]) {
					t.Errorf("key %s first delivered as %v, committed as %v", key, firsts[key], want[k])
				}
			}
			if n != total {
				t.Errorf("%d distinct events delivered; %d committed", n, total)
			}
			unsure := 0
			for _, m := range maybe {
				if m {
					unsure++
				}
			}
			t.Logf("%d events committed (%d COMMITs failed at the cut), %d delivered again", total, unsure, dups)
		})
	}
}

// publishWithin publishes env through ob in a transaction of its own on
// db, and reports whether an error came from the COMMIT (the outcome is
// then unknown; before it, nothing was committed).
func publishWithin(ctx context.Context, db *sql.DB, ob *outbox.Outbox, env outbox.Envelope) (atCommit bool, err error) {
	tx, err := outbox.BeginTx(ctx, db, nil)
	if err != nil {
		return false, err
	}
	if _, err := ob.PublishTx(ctx, tx, env); err != nil {
		tx.Rollback()
		return false, err
	}
	return true, tx.Commit()
}

// throughProxy opens the named test database through a TCP proxy of its
// own, which it returns too; both end with t.
func throughProxy(t *testing.T, name string) (*sqlx.DB, *testbroker.Proxy) {
	t.Helper()
	var drv, dsn string
	var p *testbroker.Proxy
	switch name {
	case "mysql":
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		p = testbroker.NewProxy(t, cfg.Addr)
		cfg.Addr = p.Addr()
		drv, dsn = "mysql", cfg.FormatDSN()
	case "postgres":
		u, err := url.Parse(testdb.PostgresDSN())
		if err != nil {
			t.Fatal(err)
		}
		p = testbroker.NewProxy(t, u.Host)
		u.Host = p.Addr()
		drv, dsn = "pgx", u.String()
	default:
		t.Fatalf("no proxy for %s", name)
	}
	db, err := sqlx.Open(drv, dsn)
	if err != nil {
		t.Fatal(fmt.Errorf("open %s through %s: %w", name, p.Addr(), err))
	}
	db.SetMaxOpenConns(40)
	db.SetMaxIdleConns(40)
	t.Cleanup(func() { db.Close() })
	return db, p
}
