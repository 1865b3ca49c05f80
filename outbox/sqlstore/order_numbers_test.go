package sqlstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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
// table holds, for the tests of how events are numbered.
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
// Row.KeyAfter set as given, for owner ("" none), and returns its id and
// number.
func (n *numbers) pub(after int64, owner string) (string, int64) {
	n.t.Helper()
	ctx := context.Background()
	tx, err := n.db.BeginTxx(ctx, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	r := n.row(after)
	if _, _, err := n.st.InsertOrdered(ctx, tx, &r, owner, time.Minute, blockA); err != nil {
		tx.Rollback()
		n.t.Fatalf("InsertOrdered: %v", err)
	}
	if err := tx.Commit(); err != nil {
		n.t.Fatal(err)
	}
	return r.ID, r.KeySeq
}

func (n *numbers) row(after int64) driver.Row {
	return driver.Row{ID: outbox.NewID(), Type: "order.placed", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: n.key, KeyAfter: after}
}

// threeDelivered writes three events of the key, leased to "me", and
// marks them DONE; it returns their ids and the last number.
func (n *numbers) threeDelivered() ([]string, int64) {
	n.t.Helper()
	var ids []string
	var last int64
	for range 3 {
		id, seq := n.pub(last, "me")
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

// Publishers of one key race, some writing two events in one
// transaction. Every transaction commits, no two
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
					for range each {
						ctx := context.Background()
						dbtx, err := n.db.BeginTxx(ctx, nil)
						if err != nil {
							errs <- err
							return
						}
						rec := tx{start: time.Now()}
						events := 1 + rng.IntN(2)
						for range events {
							r := n.row(0)
							if _, _, err := n.st.InsertOrdered(ctx, dbtx, &r, "", time.Minute, blockA); err != nil {
								dbtx.Rollback()
								errs <- fmt.Errorf("InsertOrdered: %w", err)
								return
							}
							rec.nums = append(rec.nums, r.KeySeq)
						}
						if err := dbtx.Commit(); err != nil {
							errs <- err
							return
						}
						rec.commits = time.Now()
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

// A deleted event's number is never given again: the key's row keeps
// the key's highest number.
func TestDeletedNumbersAreNotGivenAgain(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			n := newNumbers(t, name, sqlstore.Options{})
			ctx := context.Background()
			_, s3 := n.threeDelivered()
			// A negative age takes every delivered row, however recent
			// (SQLite's clock has milliseconds).
			if got, err := n.st.Cleanup(ctx, -time.Minute, 100, false); err != nil || got != 3 {
				t.Fatalf("Cleanup: %d, %v; want 3", got, err)
			}
			if seq, _ := n.keyRow(); seq < s3 {
				t.Fatalf("after the cleanup deleted number %d, the key's row is at %d", s3, seq)
			}
			if _, s4 := n.pub(0, ""); s4 != s3+1 {
				t.Fatalf("the event after a cleanup is numbered %d; want %d (numbers 1–%d are gone, not free)", s4, s3+1, s3)
			}
			// A dead event purged: the same.
			e5, s5 := n.pub(s3+1, "me") // leased: "me" holds s3+1 (KeyAfter)
			if ok, err := n.st.MarkDead(ctx, "me", e5, "boom"); err != nil || !ok {
				t.Fatalf("MarkDead: %v, %v", ok, err)
			}
			if got, err := n.st.PurgeLetters(ctx, []outbox.DeadLetter{{ID: e5}}); err != nil || got != 1 {
				t.Fatalf("PurgeLetters: %d, %v; want 1", got, err)
			}
			if _, _, ok := n.stored(e5); ok {
				t.Fatal("the purged event is still stored")
			}
			if _, s6 := n.pub(0, ""); s6 != s5+1 {
				t.Fatalf("the event after a purge is numbered %d; want %d", s6, s5+1)
			}
		})
	}
}
