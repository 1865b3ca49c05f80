package sqlstore_test

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// ClaimHeads with a Run leases, behind each key's head, the events that
// follow it one after another, in the key's order, and stops at the first
// that is not free to go (leased, not due) or at the run's length; Run 0
// is the head only. Behind a dead event (for a blocking subscription) the
// run's events owe it as their head does (Row.Behind).
func TestClaimHeadsLeasesARunBehindTheHead(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			f := driver.OrderFilter{Block: []string{"ord"}}
			insert := func(key string) string {
				t.Helper()
				return insertKeyed(t, db, st, f, key).ID
			}
			claimUnder := func(f driver.OrderFilter, run int, keys ...string) []string {
				t.Helper()
				rows, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: "b", Limit: 10, Lease: time.Minute, Run: run}, keys, f)
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for i, r := range rows {
					if i > 0 && r.OrderingKey == rows[i-1].OrderingKey && r.KeySeq != rows[i-1].KeySeq+1 {
						t.Errorf("ClaimHeads: %s numbered %d after %d: a gap in a run", r.ID, r.KeySeq, rows[i-1].KeySeq)
					}
					ids = append(ids, r.ID)
				}
				return ids
			}
			claim := func(run int, keys ...string) []string {
				t.Helper()
				return claimUnder(f, run, keys...)
			}
			var a []string
			for range 6 {
				a = append(a, insert("a"))
			}
			wantIDs(t, "ClaimHeads(a), run 3", claim(3, "a"), a[:4]...)
			wantIDs(t, "ClaimHeads(a) while a's run is leased", claim(3, "a"))
			// The run's events go back (a shutdown): the key's first is
			// its head again, and the whole key comes as one run.
			if err := st.Release(ctx, "b", a[:4], 0); err != nil {
				t.Fatal(err)
			}
			wantIDs(t, "ClaimHeads(a), run 10", claim(10, "a"), a...)

			// The head done: the next one heads the rest.
			b := []string{insert("b"), insert("b"), insert("b")}
			wantIDs(t, "ClaimHeads(b), run 0", claim(0, "b"), b[0])
			done(t, st, b[0])
			wantIDs(t, "ClaimHeads(b) once its first is done, run 1", claim(1, "b"), b[1:]...)

			// Run 0: the head only.
			c1 := insert("c")
			insert("c")
			wantIDs(t, "ClaimHeads(c), run 0", claim(0, "c"), c1)

			// An event that failed and is due later ends the run: the
			// events behind it wait for it.
			d1 := insert("d")
			insert("d")
			wantIDs(t, "ClaimHeads(d), run 0", claim(0, "d"), d1)
			if ok, err := st.MarkRetry(ctx, "b", d1, time.Hour, "later"); err != nil || !ok {
				t.Fatalf("MarkRetry = %v, %v", ok, err)
			}
			wantIDs(t, "ClaimHeads(d) with its head due in an hour", claim(10, "d"))

			// Something dead pending for a blocking subscription: no run,
			// whatever its place in the key.
			e1 := insert("e")
			wantIDs(t, "ClaimHeads(e), run 0", claim(0, "e"), e1)
			if ok, err := st.MarkDead(ctx, "b", e1, "poison"); err != nil || !ok {
				t.Fatalf("MarkDead = %v, %v", ok, err)
			}
			e2 := insert("e")
			// A run behind it all the same: each of its events owes
			// the dead one for "ord", as its head does.
			e3 := insert("e")
			rows, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: "b", Limit: 10, Lease: time.Minute, Run: 10}, []string{"e"}, f)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rows {
				got = append(got, r.ID)
				if !slices.Equal(r.Behind, []string{"ord"}) {
					t.Errorf("ClaimHeads(e): %s has Behind %v; want [ord], behind the dead event", r.ID, r.Behind)
				}
			}
			wantIDs(t, "ClaimHeads(e) behind a dead event", got, e2, e3)

			// A head replayed while an event far down its key is in
			// flight (OrderedSkipDead went on without it) waits for that
			// one, however far down: a claim reads a window of each key's
			// first events only, and the lease still finds the one leased.
			skip := driver.OrderFilter{Skip: []string{"ord"}}
			var g []string
			for range 10 {
				g = append(g, insertKeyed(t, db, st, skip, "g").ID)
			}
			claimSkip := func(run int) []string {
				t.Helper()
				return claimUnder(skip, run, "g")
			}
			wantIDs(t, "ClaimHeads(g), run 0", claimSkip(0), g[0])
			if ok, err := st.MarkDead(ctx, "b", g[0], "poison"); err != nil || !ok {
				t.Fatalf("MarkDead = %v, %v", ok, err)
			}
			wantIDs(t, "ClaimHeads(g) past its dead head, run 10", claimSkip(10), g[1:]...)
			done(t, st, g[1:8]...) // g[8] and g[9] still in flight
			if n, err := st.Replay(ctx, g[:1]); err != nil || n != 1 {
				t.Fatalf("Replay = %d, %v", n, err)
			}
			wantIDs(t, "ClaimHeads(g), run 0, its replayed head behind an event in flight 8 further down", claimSkip(0))
			wantIDs(t, "ClaimHeads(g), run 10, the same", claimSkip(10))
			done(t, st, g[8:]...)
			wantIDs(t, "ClaimHeads(g) once the events in flight are done", claimSkip(10), g[0])
		})
	}
}

// insertKeyed publishes an ordered event of key in a transaction of its
// own, and returns its row as numbered.
func insertKeyed(t *testing.T, db *sqlx.DB, st *sqlstore.Store, f driver.OrderFilter, key string) driver.Row {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: key}
	if _, _, err := st.InsertOrdered(ctx, tx, &r, "", time.Minute, f); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantIDs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v; want %v", what, got, want)
	}
}

// done marks ids, leased to "b", DONE.
func done(t *testing.T, st *sqlstore.Store, ids ...string) {
	t.Helper()
	if n, err := st.MarkDone(context.Background(), "b", ids, regNow(t, st)); err != nil || n != len(ids) {
		t.Fatalf("MarkDone = %d, %v; want %d", n, err, len(ids))
	}
}

// MarkDoneKeys reports a key as having later events waiting when the
// last of its events in the batch says nothing of its next one, even if
// an earlier event of the batch was handed on to it (KeyDone.Next): a key
// not reported waits for the poll's sweep (seconds, at the idle
// back-off).
func TestMarkDoneKeysLooksPastAnEventHandedOn(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			f := driver.OrderFilter{Block: []string{"ord"}}
			var rows []driver.Row
			for range 3 {
				rows = append(rows, insertKeyed(t, db, st, f, "k"))
			}
			got, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: "b", Limit: 1, Lease: time.Minute, Run: 1}, []string{"k"}, f)
			if err != nil || len(got) != 2 {
				t.Fatalf("ClaimHeads = %d rows, %v; want the first two events", len(got), err)
			}
			// The first handed on to the second, delivered here too; the
			// third waits in the table.
			evs := []driver.KeyDone{
				{EventID: rows[0].ID, Key: "k", Seq: rows[0].KeySeq},
				{EventID: rows[1].ID, Key: "k", Seq: rows[1].KeySeq},
			}
			n, later, err := st.MarkDoneKeys(ctx, "b", []string{rows[0].ID, rows[1].ID}, evs, regNow(t, st))
			if err != nil || n != 2 {
				t.Fatalf("MarkDoneKeys = %d, %v; want 2", n, err)
			}
			if !slices.Contains(later, "k") {
				t.Errorf("MarkDoneKeys reported later %v; want key k, whose third event waits", later)
			}
		})
	}
}

// takeCount counts the sequencer's claims of heads that leased events.
type takeCount struct {
	outbox.NopMetrics
	took   atomic.Int64
	splits atomic.Int64 // Split statements
}

func (m *takeCount) Statement(name string, rows int, _ time.Duration) {
	if (name == "claim_heads" || name == "claim_deliveries") && rows > 0 {
		m.took.Add(1)
	}
	if name == "split" {
		m.splits.Add(1)
	}
}

// A backlog of an ordered subscription (paused while 6 keys got 50
// events each; a destination's outage is the same) drains in runs: each
// key's events are claimed behind its head, a run at a time, and go out
// in the key's order one after another from memory, not one claim per
// event (which drained ~10 events per key and second on MariaDB). The
// same with another subscription taking the events meanwhile: then the
// backlog is the paused one's deliveries of split events.
func TestOrderedBacklogDrainsInRuns(t *testing.T) {
	const keys, per = 6, 50
	for _, name := range testdb.Names {
		for _, other := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/other=%v", name, other), func(t *testing.T) {
				testBacklogDrainsInRuns(t, name, other, keys, per)
			})
		}
	}
}

func testBacklogDrainsInRuns(t *testing.T, name string, other bool, keys, per int) {
	{
		{
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			log := newKeyLog(t, keys*per)
			m := &takeCount{}
			subs := []outbox.Subscription{{Name: "o", Order: outbox.Ordered, Handler: log.handle}}
			var others atomic.Int64
			allOthers := make(chan struct{})
			if other {
				subs = append(subs, outbox.Subscription{Name: "u", Handler: func(context.Context, outbox.Event) error {
					if others.Add(1) == int64(keys*per) {
						close(allOthers)
					}
					return nil
				}})
			}
			// No poll on its own: every step of the drain must wake what
			// takes the next one (a missed wake-up would wait a minute).
			ob := startOrdered(t, st, outbox.Config{Metrics: m, PollInterval: time.Minute, PollMaxInterval: time.Minute}, subs...)
			if err := ob.Pause(ctx, "o"); err != nil {
				t.Fatal(err)
			}
			published := make([][]string, keys)
			var wg sync.WaitGroup
			for k := range keys {
				wg.Go(func() {
					for range per {
						published[k] = append(published[k], publishInTx(t, ob, st, outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: strconv.Itoa(k), JSON: []byte(`{}`)}))
					}
				})
			}
			wg.Wait()
			before, splits := m.took.Load(), m.splits.Load()
			if err := ob.Resume(ctx, "o"); err != nil {
				t.Fatal(err)
			}
			log.wait(t, 30*time.Second)
			for k := range keys {
				log.wantKey(t, "Acct:"+strconv.Itoa(k), published[k])
			}
			if n := m.took.Load() - before; n >= int64(per/2) {
				t.Errorf("the backlog took %d claims that leased events; want a few runs, far below %d (one per event of a key)", n, per)
			}
			// Events of a run deferred for o, behind on their key, are
			// split a batch at a time, not one write each.
			t.Logf("%d Split statements after Resume", m.splits.Load()-splits)
			if n := m.splits.Load() - splits; n >= int64(keys*per/10) {
				t.Errorf("the backlog took %d Split statements; want them batched, far below %d (one per event)", n, keys*per)
			}
			if other {
				select {
				case <-allOthers:
				case <-time.After(30 * time.Second):
					t.Errorf("u received %d events; want all %d", others.Load(), keys*per)
				}
			}
		}
	}
}

// ClaimDeliveries with a Run leases, behind a delivery to an ordered
// subscription that is its key's turn (the head), the deliveries to that
// subscription of the events that follow in the key, in order, and stops
// at the first event that is not split with such a delivery free to go.
func TestClaimDeliveriesLeasesARunBehindTheHead(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			f := driver.OrderFilter{Block: []string{"o"}}
			insert := func(key string) string {
				t.Helper()
				return insertKeyed(t, db, st, f, key).ID
			}
			// split claims key's head as a whole and splits it: another
			// subscription took it, o's delivery waits (NEW).
			split := func(key, want string) {
				t.Helper()
				rows, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: "a", Limit: 1, Lease: time.Minute}, []string{key}, f)
				if err != nil || len(rows) != 1 || rows[0].ID != want {
					t.Fatalf("ClaimHeads(%s) = %v, %v; want %s", key, rows, err, want)
				}
				if ok, err := splitOne(ctx, st, "a", want, []driver.DeliveryWrite{{Subscription: "o", Status: outbox.StatusNew}}, regNow(t, st)); !ok || err != nil {
					t.Fatalf("Split = %v, %v", ok, err)
				}
			}
			claim := func(run int) []string {
				t.Helper()
				ds, err := st.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "b", Limit: 10, Lease: time.Minute, Run: run}, []string{"o"}, f)
				if err != nil {
					t.Fatal(err)
				}
				slices.SortStableFunc(ds, func(a, b driver.Delivery) int {
					return cmp.Or(strings.Compare(a.OrderingKey, b.OrderingKey), cmp.Compare(a.KeySeq, b.KeySeq))
				})
				var ids []string
				for _, d := range ds {
					ids = append(ids, d.ID)
				}
				return ids
			}
			var a []string
			for range 5 {
				a = append(a, insert("a"))
				split("a", a[len(a)-1])
			}
			// b: two split, then one whole (NEW) that o has not had.
			b := []string{insert("b"), insert("b")}
			split("b", b[0])
			split("b", b[1])
			b = append(b, insert("b"), insert("b"))
			wantIDs(t, "ClaimDeliveries(o), run 0", claim(0), a[0], b[0])
			if err := st.ReleaseDeliveries(ctx, "b", []driver.DeliveryID{{EventID: a[0], Subscription: "o"}, {EventID: b[0], Subscription: "o"}}, 0); err != nil {
				t.Fatal(err)
			}
			// Run 6 over two heads: 3 behind each; b's stops at its whole
			// event.
			wantIDs(t, "ClaimDeliveries(o), run 6", claim(6), a[0], a[1], a[2], a[3], b[0], b[1])
			wantIDs(t, "ClaimDeliveries(o) while the runs are leased", claim(6))
		})
	}
}

// An event published behind a key held up in the table (its head
// deferred for a paused subscription, those behind it given back) is not
// left leased to the publishing instance to no purpose. It used to be
// leased here (Row.KeyAfter still named the numbers given back), every
// later event of the key with it, and a burst of them overflowed what the
// poller releases, leaving them leased until their leases ran out, the
// key's backlog stuck behind them: with a lease longer than the test's
// wait, the key then does not drain after Resume.
func TestOrderedEventBehindAKeyGivenBackIsNotLeftLeased(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			log := newKeyLog(t, 4)
			ob := startOrdered(t, st, outbox.Config{Lease: time.Minute}, outbox.Subscription{Name: "o", Order: outbox.Ordered, Handler: log.handle})
			if err := ob.Pause(ctx, "o"); err != nil {
				t.Fatal(err)
			}
			env := outbox.Envelope{Type: "T", AggregateType: "Acct", AggregateID: "1", JSON: []byte(`{}`)}
			tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for range 3 {
				id, err := ob.PublishTx(ctx, tx, env)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			// The head goes to the hot path, is deferred for the paused
			// subscription; the two behind it are given back.
			leased := func(id string) bool {
				var n int
				if err := st.DB().QueryRow(st.DB().Rebind(`SELECT COUNT(*) FROM `+st.Table()+` WHERE id = ? AND locked_by IS NOT NULL`), id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 0
			}
			waitUntil(t, 10*time.Second, "the events behind the deferred head given back", func() bool {
				return !leased(ids[1]) && !leased(ids[2])
			})
			tx, err = outbox.BeginTx(ctx, st.DB().DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			id, err := ob.PublishTx(ctx, tx, env)
			if err != nil {
				t.Fatal(err)
			}
			var owner sql.NullString
			if err := tx.QueryRowContext(ctx, st.DB().Rebind(`SELECT locked_by FROM `+st.Table()+` WHERE id = ?`), id).Scan(&owner); err != nil {
				t.Fatal(err)
			}
			// Leased here only as the next of an event this instance
			// holds: a key's head is leased even when only subscriptions
			// behind take it, so the events given back may have been
			// claimed again meanwhile (and deferred for o). What must
			// hold is that nothing stays leased to no purpose: with a
			// lease longer than the wait below, an event left leased
			// would keep the key from draining.
			t.Logf("the event published behind the key's backlog is leased to %q", owner.String)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
			if err := ob.Resume(ctx, "o"); err != nil {
				t.Fatal(err)
			}
			log.wait(t, 30*time.Second)
			log.wantKey(t, "Acct:1", ids)
		})
	}
}

// Instances claiming the same keys' heads at once (ClaimHeads with runs,
// as the sequencers of several instances do while a backlog drains):
// each claim of a key begins at the key's first undelivered event and
// goes on without a gap, and no two claimers hold events of one key at
// the same time, however their reads and leases interleave.
func TestConcurrentClaimsOfHeadsShareNoKey(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			const (
				nkeys     = 20
				per       = 30
				claimers  = 4
				runLength = 5
			)
			var f driver.OrderFilter
			var keys []string
			for k := range nkeys {
				keys = append(keys, "k"+strconv.Itoa(k))
			}
			for range per {
				for _, k := range keys {
					insertKeyed(t, db, st, f, k)
				}
			}
			var mu sync.Mutex
			next := map[string]int64{}    // the key's first number not delivered
			holder := map[string]string{} // who holds events of the key
			var delivered atomic.Int64
			deadline := time.Now().Add(2 * time.Minute)
			var wg sync.WaitGroup
			for c := range claimers {
				owner := "c" + strconv.Itoa(c)
				wg.Go(func() {
					for delivered.Load() < nkeys*per && time.Now().Before(deadline) && !t.Failed() {
						rows, err := st.ClaimHeads(ctx, driver.ClaimRequest{Owner: owner, Limit: nkeys, Lease: time.Minute, Run: nkeys * runLength}, keys, f)
						if err != nil {
							t.Error(err)
							return
						}
						byKey := map[string][]driver.Row{}
						for _, r := range rows {
							byKey[r.OrderingKey] = append(byKey[r.OrderingKey], r)
						}
						mu.Lock()
						for k, rs := range byKey {
							if h := holder[k]; h != "" {
								t.Errorf("%s claimed key %s while %s holds it", owner, k, h)
							}
							want := max(next[k], 1)
							for _, r := range rs {
								if r.KeySeq != want {
									t.Errorf("%s claimed %s #%d, want #%d (the key's next)", owner, k, r.KeySeq, want)
								}
								want = r.KeySeq + 1
							}
							holder[k] = owner
						}
						mu.Unlock()
						// Delivered: the key is given up before its DONE is
						// written, so that nobody can claim it in between.
						var ids []string
						mu.Lock()
						for k, rs := range byKey {
							next[k] = rs[len(rs)-1].KeySeq + 1
							delete(holder, k)
							for _, r := range rs {
								ids = append(ids, r.ID)
							}
						}
						mu.Unlock()
						if len(ids) == 0 {
							continue
						}
						if n, err := st.MarkDone(ctx, owner, ids, regNow(t, st)); err != nil || n != len(ids) {
							t.Errorf("MarkDone(%s) = %d, %v; want %d", owner, n, err, len(ids))
							return
						}
						delivered.Add(int64(len(ids)))
					}
				})
			}
			wg.Wait()
			if n := delivered.Load(); n != nkeys*per {
				t.Errorf("%d of %d events delivered", n, nkeys*per)
			}
		})
	}
}
