package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// numbers writes ordered events of one store and reads back what the
// table holds, for the tests of how events are numbered (Row.KeyLast).
type numbers struct {
	t   *testing.T
	db  *sqlx.DB
	st  *sqlstore.Store
	key string
}

func newNumbers(t *testing.T, name string, opts sqlstore.Options) *numbers {
	db := testdb.Open(t, name)
	return &numbers{t: t, db: db, st: testdb.StoreWith(t, db, opts), key: "k"}
}

var blockA = driver.OrderFilter{Block: []string{"a"}}

// pub writes one ordered event in a transaction of its own, with
// Row.KeyLast and Row.KeyAfter set as given, for owner ("" none), and
// returns its id and number.
func (n *numbers) pub(last, after int64, owner string) (string, int64) {
	n.t.Helper()
	ctx := context.Background()
	tx, err := n.db.BeginTxx(ctx, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	r := n.row(last, after)
	if _, _, err := n.st.InsertOrdered(ctx, tx, &r, owner, time.Minute, blockA); err != nil {
		tx.Rollback()
		n.t.Fatalf("InsertOrdered (KeyLast %d): %v", last, err)
	}
	if err := tx.Commit(); err != nil {
		n.t.Fatal(err)
	}
	return r.ID, r.KeySeq
}

func (n *numbers) row(last, after int64) driver.Row {
	return driver.Row{ID: outbox.NewID(), Type: "order.placed", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: n.key, KeyLast: last, KeyAfter: after}
}

// threeDelivered writes three events of the key, numbered 1 from the
// key's row, then 2 and 3 from KeyLast, and marks them DONE; it returns
// their ids and the last number.
func (n *numbers) threeDelivered() ([]string, int64) {
	n.t.Helper()
	var ids []string
	var last int64
	for range 3 {
		id, seq := n.pub(last, last, "me")
		ids, last = append(ids, id), seq
	}
	if got, err := n.st.MarkDone(context.Background(), "me", ids, regNow(n.t, n.st)); err != nil || got != 3 {
		n.t.Fatalf("MarkDone: %d, %v; want 3", got, err)
	}
	return ids, last
}

// keyRow returns the key's row: its number and its delivered number.
func (n *numbers) keyRow() (seq, done int64) {
	n.t.Helper()
	if err := n.db.QueryRowx(n.db.Rebind(`SELECT seq, done_seq FROM `+n.st.KeysTable()+` WHERE ordering_key = ?`), n.key).Scan(&seq, &done); err != nil {
		n.t.Fatal(err)
	}
	return seq, done
}

// stored returns the event's status and number as the table has them;
// ok false if the row is gone.
func (n *numbers) stored(id string) (status int, seq int64, ok bool) {
	n.t.Helper()
	err := n.db.QueryRowx(n.db.Rebind(`SELECT status, key_seq FROM `+n.st.Tables()[0]+` WHERE id = ?`), id).Scan(&status, &seq)
	if err != nil {
		return 0, 0, false
	}
	return status, seq, true
}

// An instance that committed a key's event numbers the key's next one
// itself (Row.KeyLast), with no write to the key's row; a publisher that
// numbers from the lagging key's row, or from a KeyLast gone stale, finds
// its number taken and takes the one after the key's highest. PostgreSQL
// only: MySQL and SQLite always number from the key's row (the numbers
// must come out the same).
func TestKeyLastNumbersTheNextEventWithoutTheKeyRow(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			n := newNumbers(t, name, sqlstore.Options{})
			fast := name == "postgres"
			if got := sqlstore.Fenced(n.st); got != fast {
				t.Fatalf("the store numbers events from KeyLast: %v; want %v (migration 004's unique index)", got, fast)
			}
			_, s1 := n.pub(0, 0, "me")
			_, s2 := n.pub(s1, s1, "me")
			if s1 != 1 || s2 != 2 {
				t.Fatalf("numbers %d, %d; want 1, 2", s1, s2)
			}
			if seq, _ := n.keyRow(); fast && seq != 1 {
				t.Fatalf("after an event numbered from KeyLast, the key's row is at %d; want 1 (not written)", seq)
			}
			_, s3 := n.pub(s1, 0, "") // KeyLast stale: 2 is taken
			_, s4 := n.pub(0, 0, "")  // from the key's row
			_, s5 := n.pub(s2, 0, "") // stale again: 3 is taken
			_, s6 := n.pub(s5, 0, "")
			if got, want := []int64{s3, s4, s5, s6}, []int64{3, 4, 5, 6}; !slices.Equal(got, want) {
				t.Fatalf("numbers after a stale KeyLast and the key's row: %v; want %v", got, want)
			}
			if seq, _ := n.keyRow(); seq < 5 {
				t.Fatalf("the key's row is at %d after a publisher numbered 5 from it; want at least 5", seq)
			}
		})
	}
}

// Publishers of one key race: some number from the key's row, some from
// the last number they committed themselves (as an instance does), some
// from a number committed a while ago by anyone (a stale KeyLast), some
// write two events in one transaction. Every transaction commits, no two
// events share a number, a transaction's two events are consecutive, and
// an event whose INSERT started after another's transaction had committed
// has the higher number: numbers follow commit order.
func TestRacingPublishersOfOneKeyNumberInCommitOrder(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			n := newNumbers(t, name, sqlstore.Options{})
			workers, each := 8, 30
			if name == "sqlite" {
				workers, each = 4, 15
			}
			type tx struct {
				nums           []int64
				start, commits time.Time
			}
			var (
				mu        sync.Mutex
				txs       []tx
				committed []int64
			)
			base := time.Now()
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					var mine int64 // the last number this worker committed
					for range each {
						var last int64
						switch rng.IntN(3) {
						case 0:
							last = mine
						case 1:
							mu.Lock()
							if len(committed) > 0 {
								last = committed[rng.IntN(len(committed))]
							}
							mu.Unlock()
						}
						ctx := context.Background()
						dbtx, err := n.db.BeginTxx(ctx, nil)
						if err != nil {
							errs <- err
							return
						}
						rec := tx{start: time.Now()}
						events := 1 + rng.IntN(2)
						for range events {
							r := n.row(last, 0)
							if _, _, err := n.st.InsertOrdered(ctx, dbtx, &r, "", time.Minute, blockA); err != nil {
								dbtx.Rollback()
								errs <- fmt.Errorf("InsertOrdered (KeyLast %d): %w", last, err)
								return
							}
							rec.nums = append(rec.nums, r.KeySeq)
							last = r.KeySeq // the engine's rule within a transaction
						}
						if err := dbtx.Commit(); err != nil {
							errs <- err
							return
						}
						rec.commits = time.Now()
						mine = last
						mu.Lock()
						txs = append(txs, rec)
						committed = append(committed, rec.nums...)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			seen := map[int64]bool{}
			for _, a := range txs {
				for i, s := range a.nums {
					if s <= 0 || seen[s] {
						t.Fatalf("number %d given twice (or not at all); transactions: %v", s, len(txs))
					}
					seen[s] = true
					if i > 0 && s != a.nums[i-1]+1 {
						t.Fatalf("one transaction's events are numbered %v; want consecutive", a.nums)
					}
				}
				for _, b := range txs {
					if a.commits.Before(b.start) && a.nums[0] > b.nums[0] {
						t.Fatalf("a transaction committed at +%v numbered %v; one that started after, at +%v, got %v", a.commits.Sub(base), a.nums, b.start.Sub(base), b.nums)
					}
				}
			}
			var stored int
			if err := n.db.QueryRowx(`SELECT COUNT(DISTINCT key_seq) FROM ` + n.st.Tables()[0]).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if stored != len(seen) {
				t.Fatalf("the table holds %d distinct numbers; the publishers were given %d", stored, len(seen))
			}
		})
	}
}

// A deleted event's number is never given again: the cleanup takes the
// key's row to the numbers it deletes, which instances had given out
// without the row (KeyLast).
func TestDeletedNumbersAreNotGivenAgain(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			n := newNumbers(t, name, sqlstore.Options{})
			ctx := context.Background()
			_, s3 := n.threeDelivered()
			sqlstore.SetKeep(n.st, 0)
			// A negative age takes every delivered row, however recent
			// (SQLite's clock has milliseconds).
			if got, err := n.st.Cleanup(ctx, -time.Minute, 100, false); err != nil || got != 3 {
				t.Fatalf("Cleanup: %d, %v; want 3", got, err)
			}
			if seq, _ := n.keyRow(); seq < s3 {
				t.Fatalf("after the cleanup deleted number %d, the key's row is at %d", s3, seq)
			}
			if _, s4 := n.pub(0, 0, ""); s4 != s3+1 {
				t.Fatalf("the event after a cleanup is numbered %d; want %d (numbers 1–%d are gone, not free)", s4, s3+1, s3)
			}
			// A dead event purged: the same.
			e5, s5 := n.pub(s3+1, s3+1, "me")
			if ok, err := n.st.MarkDead(ctx, "me", e5, "boom"); err != nil || !ok {
				t.Fatalf("MarkDead: %v, %v", ok, err)
			}
			if got, err := n.st.PurgeLetters(ctx, []outbox.DeadLetter{{ID: e5}}); err != nil || got != 1 {
				t.Fatalf("PurgeLetters: %d, %v; want 1", got, err)
			}
			if _, _, ok := n.stored(e5); ok {
				t.Fatal("the purged event (keep 0) is still stored")
			}
			if _, s6 := n.pub(0, 0, ""); s6 != s5+1 {
				t.Fatalf("the event after a purge is numbered %d; want %d", s6, s5+1)
			}
		})
	}
}

// On PostgreSQL an ordered event stays stored for 10 minutes after it was
// written, whatever deletes it: the cleanup passes it over, a purge of it
// as a dead letter makes it DONE, DeleteDelivered keeps it DONE until a
// later completion sweeps it. Events that are not ordered go as before,
// and so does every event on MySQL and SQLite.
func TestYoungOrderedEventsAreKept(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := newNumbers(t, name, sqlstore.Options{})
			o1, _ := n.pub(0, 0, "me")
			u1 := outbox.NewID()
			u := driver.Row{ID: u1, Type: "order.placed", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
			if err := n.st.Insert(ctx, n.db, &u, "me", time.Minute); err != nil {
				t.Fatal(err)
			}
			if got, err := n.st.MarkDone(ctx, "me", []string{o1, u1}, regNow(t, n.st)); err != nil || got != 2 {
				t.Fatalf("MarkDone: %d, %v", got, err)
			}
			keeps := name == "postgres"
			want := 2
			if keeps {
				want = 1
			}
			if got, err := n.st.Cleanup(ctx, -time.Minute, 100, false); err != nil || got != int64(want) {
				t.Fatalf("Cleanup of a delivered ordered and a delivered unordered event: %d deleted, %v; want %d", got, err, want)
			}
			if _, _, ok := n.stored(o1); ok != keeps {
				t.Fatalf("an ordered event written a moment ago, after the cleanup: stored %v; want %v", ok, keeps)
			}
			o2, _ := n.pub(1, 1, "me")
			if ok, err := n.st.MarkDead(ctx, "me", o2, "boom"); err != nil || !ok {
				t.Fatalf("MarkDead: %v, %v", ok, err)
			}
			if got, err := n.st.PurgeLetters(ctx, []outbox.DeadLetter{{ID: o2}}); err != nil || got != 1 {
				t.Fatalf("PurgeLetters: %d, %v; want 1", got, err)
			}
			if status, _, ok := n.stored(o2); ok != keeps || (keeps && status != int(outbox.StatusDone)) {
				t.Fatalf("a purged ordered event written a moment ago: stored %v, status %d; want kept DONE: %v", ok, status, keeps)
			}
			if dead, err := n.st.FindDead(ctx, outbox.DeadFilter{}); err != nil || len(dead) != 0 {
				t.Fatalf("dead letters after the purge: %v, %v; want none", dead, err)
			}

			d := newNumbers(t, name, sqlstore.Options{DeleteDelivered: true})
			o3, _ := d.pub(0, 0, "me")
			u3 := outbox.NewID()
			u = driver.Row{ID: u3, Type: "order.placed", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
			if err := d.st.Insert(ctx, d.db, &u, "me", time.Minute); err != nil {
				t.Fatal(err)
			}
			if got, err := d.st.MarkDone(ctx, "me", []string{o3, u3}, regNow(t, d.st)); err != nil || got != 2 {
				t.Fatalf("MarkDone (DeleteDelivered): %d, %v; want 2", got, err)
			}
			if _, _, ok := d.stored(u3); ok {
				t.Fatal("DeleteDelivered kept a delivered unordered event")
			}
			if status, _, ok := d.stored(o3); ok != keeps || (keeps && status != int(outbox.StatusDone)) {
				t.Fatalf("DeleteDelivered and an ordered event written a moment ago: stored %v, status %d; want kept DONE: %v", ok, status, keeps)
			}
			sqlstore.SetKeep(d.st, 0)
			o4, _ := d.pub(1, 1, "me")
			if got, err := d.st.MarkDone(ctx, "me", []string{o4}, regNow(t, d.st)); err != nil || got != 1 {
				t.Fatalf("MarkDone: %d, %v", got, err)
			}
			for _, id := range []string{o3, o4} {
				if _, _, ok := d.stored(id); ok {
					t.Fatalf("DeleteDelivered with keep 0: event %s is still stored after a completion", id)
				}
			}
		})
	}
}

// The completion of a key's event reports the key as having a later event
// when that one was numbered without the key's row (KeyLast), so that the
// engine claims it at once instead of at the next poll.
func TestMarkDoneKeysFindsANextEventTheKeyRowMissed(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			n := newNumbers(t, name, sqlstore.Options{})
			e1, s1 := n.pub(0, 0, "me")
			n.pub(s1, 0, "") // free: waits in the table
			_, later, err := n.st.MarkDoneKeys(ctx, "me", []string{e1}, []driver.KeyDone{{EventID: e1, Key: n.key, Seq: s1, Done: true}}, regNow(t, n.st))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(later, n.key) {
				t.Fatalf("MarkDoneKeys reports keys %v with later events; want %q (its event numbered %d waits)", later, n.key, s1+1)
			}
		})
	}
}

// The cleanup never waits for a publishing transaction that holds a key's
// row (PostgreSQL, where a key's row may lag behind its numbers): it
// deletes the events the key's row already covers, keeps the others, and
// deletes them once that transaction has ended.
func TestCleanupPassesOverAKeyRowAPublisherHolds(t *testing.T) {
	n := newNumbers(t, "postgres", sqlstore.Options{})
	ctx := context.Background()
	ids, _ := n.threeDelivered()
	e2, e3 := ids[1], ids[2]
	sqlstore.SetKeep(n.st, 0)
	tx, err := n.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	r := n.row(0, 0) // numbered from the key's row, which tx now holds
	if _, _, err := n.st.InsertOrdered(ctx, tx, &r, "", time.Minute, blockA); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := n.st.Cleanup(cctx, -time.Minute, 100, false)
	if err != nil || got != 1 {
		t.Fatalf("Cleanup while a publisher holds the key's row: %d deleted, %v; want 1 (number 1, which the key's row covers), at once", got, err)
	}
	for _, id := range []string{e2, e3} {
		if _, _, ok := n.stored(id); !ok {
			t.Fatalf("event %s, numbered past the key's row, was deleted while a publisher held the row", id)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, err := n.st.Cleanup(ctx, -time.Minute, 100, false); err != nil || got != 2 {
		t.Fatalf("Cleanup after the publisher committed: %d deleted, %v; want 2", got, err)
	}
}

// A transaction that publishes a key twice, through two calls, numbers
// the second event after its own first one (Row.KeyLastOpen), without
// the key's row on PostgreSQL; if it rolled back to a savepoint that
// took the first one back, the second takes the first's number instead
// of leaving a gap. The numbers are the same on every database.
func TestKeyLastOpenNumbersAfterTheTransactionsOwnEvent(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			n := newNumbers(t, name, sqlstore.Options{})
			fast := name == "postgres"
			ctx := context.Background()
			begin := func() *sqlx.Tx {
				t.Helper()
				tx, err := n.db.BeginTxx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { tx.Rollback() })
				return tx
			}
			insert := func(tx *sqlx.Tx, last int64, open bool) int64 {
				t.Helper()
				r := n.row(last, 0)
				r.KeyLastOpen = open
				if _, _, err := n.st.InsertOrdered(ctx, tx, &r, "", time.Minute, blockA); err != nil {
					t.Fatalf("InsertOrdered (KeyLast %d, open %v): %v", last, open, err)
				}
				return r.KeySeq
			}
			_, s1 := n.pub(0, 0, "me")
			rowBefore, _ := n.keyRow()
			tx := begin()
			s2 := insert(tx, s1, false)
			s3 := insert(tx, s2, true)
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if s2 != s1+1 || s3 != s2+1 {
				t.Fatalf("numbers %d, %d after %d; want %d, %d", s2, s3, s1, s1+1, s1+2)
			}
			if seq, _ := n.keyRow(); fast && seq != rowBefore {
				t.Fatalf("the key's row is at %d after a transaction numbered %d and %d from KeyLast; want %d (not written)", seq, s2, s3, rowBefore)
			}
			tx = begin()
			s4 := insert(tx, s3, false)
			if _, err := tx.ExecContext(ctx, `SAVEPOINT sp`); err != nil {
				t.Fatal(err)
			}
			s5 := insert(tx, s4, true)
			if _, err := tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT sp`); err != nil {
				t.Fatal(err)
			}
			s6 := insert(tx, s5, true) // s5 is gone
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			if s4 != s3+1 || s5 != s4+1 || s6 != s5 {
				t.Fatalf("numbers %d, %d, then %d after a rollback to a savepoint took %d back; want %d, %d, %d (no gap)", s4, s5, s6, s5, s3+1, s3+2, s3+2)
			}
			var got []int64
			if err := n.db.SelectContext(ctx, &got, n.db.Rebind(`SELECT key_seq FROM `+n.st.Tables()[0]+` WHERE ordering_key = ? ORDER BY key_seq`), n.key); err != nil {
				t.Fatal(err)
			}
			if want := []int64{s1, s1 + 1, s1 + 2, s1 + 3, s1 + 4}; !slices.Equal(got, want) {
				t.Fatalf("the key's numbers: %v; want %v", got, want)
			}
		})
	}
}
