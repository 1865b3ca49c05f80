package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.Store.Claim.

// Claim takes only the types ClaimRequest.Types lists, or all but those
// NotTypes lists, among NEW and RETRY rows alike.
func testMethodClaimTypes(t *testing.T, e *env) {
	ctx := context.Background()
	ids := e.insertTyped(t, "A", "B", "C", "A", "B")
	retried := e.insertTyped(t, "B")
	claim := func(owner string, req driver.ClaimRequest) []string {
		t.Helper()
		req.Owner, req.Limit, req.Lease, req.SkipRecent = owner, 100, time.Minute, -1
		rows, err := e.store.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rows {
			got = append(got, r.ID)
		}
		slices.Sort(got)
		return got
	}
	// A RETRY row of type B.
	if got := claim("setup", driver.ClaimRequest{Types: []string{"B"}}); !slices.Contains(got, retried[0]) {
		t.Fatalf("setup claim of B: %v", got)
	} else {
		// Give the others back at once, the retried one after a failure.
		var back []string
		for _, id := range got {
			if id != retried[0] {
				back = append(back, id)
			}
		}
		if err := e.store.Release(ctx, "setup", back, 0); err != nil {
			t.Fatal(err)
		}
		if ok, err := e.store.MarkRetry(ctx, "setup", retried[0], 0, "failed once"); err != nil || !ok {
			t.Fatalf("MarkRetry: %v %v", ok, err)
		}
	}
	want := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, ids[i])
		}
		slices.Sort(out)
		return out
	}
	if got := claim("only-a", driver.ClaimRequest{Types: []string{"A"}}); !slices.Equal(got, want(0, 3)) {
		t.Errorf("Claim with Types [A] = %v; want %v", got, want(0, 3))
	}
	bs := append(want(1, 4), retried[0])
	slices.Sort(bs)
	if got := claim("not-c", driver.ClaimRequest{NotTypes: []string{"C"}}); !slices.Equal(got, bs) {
		t.Errorf("Claim with NotTypes [C] = %v; want the B rows, new and retrying, %v", got, bs)
	}
	if got := claim("none", driver.ClaimRequest{Types: []string{}}); len(got) != 0 {
		t.Errorf("Claim with an empty Types = %v; want nothing", got)
	}
	if got := claim("rest", driver.ClaimRequest{}); !slices.Equal(got, want(2)) {
		t.Errorf("Claim without a filter = %v; want the C row %v", got, want(2))
	}
}
