package sqlstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// TestClaimsFindRowsBehindTheirCursor: claims of a backlog resume after
// the last row claimed (on MySQL/MariaDB), so rows that become due behind
// that point (handed back, their lease expired) must still be claimed:
// within a few batches while the backlog lasts, and at the latest when it
// is exhausted. Rows sharing one available_at (one multi-row INSERT) are
// each claimed exactly once across batch boundaries.
func TestClaimsFindRowsBehindTheirCursor(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := testdb.Store(t, testdb.Open(t, name))
			const n, batch = 2030, 50
			rows := make([]driver.Row, n)
			for i := range rows {
				rows[i] = driver.Row{ID: outbox.NewID(), Type: "t", Payload: fmt.Appendf(nil, `{"n":%d}`, i), PayloadJSON: true, OccurredAt: time.Now()}
			}
			// Five INSERTs of up to 500 rows: most batch boundaries
			// falls between rows of one available_at.
			if err := s.InsertBatch(ctx, s.DB(), rows, "", 0); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			claim := func(owner string) []driver.Row {
				t.Helper()
				got, err := s.Claim(ctx, driver.ClaimRequest{Owner: owner, Limit: batch, Lease: time.Hour, SkipRecent: -1})
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			claimed := map[string]int{}
			count := func(got []driver.Row) {
				for _, r := range got {
					claimed[r.ID]++
				}
			}
			// The first batch is handed back at once: it lies behind the
			// cursor of every later claim.
			first := claim("a")
			if len(first) != batch {
				t.Fatalf("first claim: %d rows, want %d", len(first), batch)
			}
			back := make([]string, len(first))
			for i, r := range first {
				back[i] = r.ID
			}
			if err := s.Release(ctx, "a", back, 0); err != nil {
				t.Fatal(err)
			}
			// Within 20 batches (the backlog is 40 and a bit), the handed-back rows
			// come again.
			again := 0
			for range 20 {
				got := claim("a")
				count(got)
				for _, r := range got {
					for _, id := range back {
						if r.ID == id {
							again++
						}
					}
				}
			}
			if again != batch {
				t.Errorf("%d of the %d rows handed back were claimed again within 20 batches of a 40-batch backlog", again, batch)
			}
			// Another owner's rows, lease expired: behind a's cursor too.
			other := claim("b")
			if len(other) != batch {
				t.Fatalf("b claimed %d rows, want %d", len(other), batch)
			}
			oids := make([]string, len(other))
			for i, r := range other {
				oids[i] = r.ID
			}
			if n, err := s.ExtendLeases(ctx, "b", oids, time.Microsecond); err != nil || n != batch {
				t.Fatalf("shorten b's leases: %d, %v", n, err)
			}
			time.Sleep(5 * time.Millisecond)
			for {
				got := claim("a")
				if len(got) == 0 {
					break
				}
				count(got)
			}
			for _, r := range rows {
				want := 1
				if claimed[r.ID] != want {
					t.Fatalf("row %s claimed %d times by a after the first batch, want %d", r.ID, claimed[r.ID], want)
				}
			}
		})
	}
}
