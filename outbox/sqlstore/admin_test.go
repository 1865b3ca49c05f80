package sqlstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// TestPurgeLetters: a dead event goes with its deliveries; a dead delivery
// goes alone, and its split event only once nothing of it is pending or
// dead; letters no longer dead are left alone. CleanupCount counts what
// Cleanup then deletes.
func TestPurgeLetters(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := testdb.Store(t, testdb.Open(t, name))
			var ids []string
			for range 4 {
				r := driver.Row{ID: outbox.NewID(), Type: "t", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
				if err := s.Insert(ctx, s.DB(), &r, "", 0); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, r.ID)
			}
			time.Sleep(5 * time.Millisecond)
			if rows, err := s.Claim(ctx, driver.ClaimRequest{Owner: "o", Limit: 10, Lease: time.Minute}); err != nil || len(rows) != 4 {
				t.Fatalf("claim: %d, %v", len(rows), err)
			}
			dead := func(sub string) driver.DeliveryWrite {
				return driver.DeliveryWrite{Subscription: sub, Status: outbox.StatusDead, Attempts: 1, Error: "x"}
			}
			if ok, err := s.MarkDead(ctx, "o", ids[0], "gone"); !ok || err != nil {
				t.Fatal(ok, err)
			}
			// ids[1]: a (dead) only; ids[2]: a dead, b retrying; ids[3]: a dead, b dead.
			for i, w := range [][]driver.DeliveryWrite{
				{dead("a")},
				{dead("a"), {Subscription: "b", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour}},
				{dead("a"), dead("b")},
			} {
				if ok, err := splitOne(ctx, s, "o", ids[i+1], w, regNow(t, s)); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
			page, err := s.FindDead(ctx, outbox.DeadFilter{Subscription: "a"})
			if err != nil || len(page) != 3 {
				t.Fatalf("find dead a: %d, %v", len(page), err)
			}
			page = append(page, outbox.DeadLetter{ID: ids[0]})
			n, err := s.PurgeLetters(ctx, page)
			if err != nil || n != 4 {
				t.Fatalf("purge: %d, %v; want 4", n, err)
			}
			if n, err := s.PurgeLetters(ctx, page); err != nil || n != 0 {
				t.Fatalf("purge again: %d, %v; want 0", n, err)
			}
			exists := func(id string) bool {
				_, err := s.Inspect(ctx, id)
				if err != nil && !errors.Is(err, outbox.ErrNotFound) {
					t.Fatal(err)
				}
				return err == nil
			}
			for i, want := range []bool{false, false, true, true} {
				if got := exists(ids[i]); got != want {
					t.Errorf("event %d exists: %v, want %v", i, got, want)
				}
			}
			var orphans int
			if err := s.DB().Get(&orphans, `SELECT COUNT(*) FROM `+s.DeliveriesTable()+` WHERE event_id NOT IN (SELECT id FROM `+s.Table()+`)`); err != nil || orphans != 0 {
				t.Errorf("orphan deliveries: %d, %v", orphans, err)
			}
			// ids[3] still has b's dead delivery: purging it takes the event.
			if n, err := s.PurgeLetters(ctx, []outbox.DeadLetter{{ID: ids[3], Subscription: "b"}}); err != nil || n != 1 || exists(ids[3]) {
				t.Errorf("purge the last dead delivery: %d, %v, event exists %v", n, err, exists(ids[3]))
			}

			// Cleanup: nothing DONE; with dead, ids[2] is still pending.
			for _, dead := range []bool{false, true} {
				c, err := s.CleanupCount(ctx, 0, dead)
				if err != nil {
					t.Fatal(err)
				}
				d, err := s.Cleanup(ctx, 0, 100, dead)
				if err != nil || d != c {
					t.Errorf("dead=%v: CleanupCount %d, Cleanup deleted %d (%v)", dead, c, d, err)
				}
			}
			peek, err := s.Peek(ctx, 10)
			if err != nil || len(peek) != 1 || peek[0].ID != ids[2] || peek[0].Subscription != "b" || peek[0].In <= 0 {
				t.Errorf("peek: %+v, %v", peek, err)
			}
			applied, err := s.AppliedMigrations(ctx)
			all, _ := s.Migrations()
			if err != nil || len(applied) != len(all) {
				t.Errorf("applied migrations: %v, %v", applied, err)
			}
		})
	}
}
