package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// insertTyped writes one free row of each of types, in order, and returns
// their ids.
func (e *env) insertTyped(t *testing.T, types ...string) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(types))
	for i, typ := range types {
		ids[i] = outbox.NewID()
		r := driver.Row{ID: ids[i], Type: typ, Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, tx, &r, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

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

// RetireSubscription refuses a subscription registered less than idle
// ago, and otherwise removes it from the registry (changing its version),
// drops its NEW and RETRY deliveries (its DEAD ones stay), and completes
// the split events left with nothing undone.
func testMethodRetire(t *testing.T, e *env) {
	rs, ok := e.store.(driver.Retirer)
	if !ok {
		t.Skip("the store does not implement driver.Retirer")
	}
	ctx := context.Background()
	ds := e.ds()
	reg, err := ds.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "keep"}, {Name: "gone"}})
	if err != nil {
		t.Fatal(err)
	}
	ids := e.insertRows(t, 3, "me", minute)
	// ids[0]: gone owes it (NEW); ids[1]: gone retries it; ids[2]: gone
	// gave up (DEAD) and keep owes it.
	writes := [][]driver.DeliveryWrite{
		{{Subscription: "gone", Status: outbox.StatusNew}},
		{{Subscription: "gone", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "down"}},
		{{Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, Error: "gave up"}, {Subscription: "keep", Status: outbox.StatusNew}},
	}
	for i, w := range writes {
		if ok, err := ds.Split(ctx, "me", ids[i], w, reg.Version); err != nil || !ok {
			t.Fatalf("Split %d: %v %v", i, ok, err)
		}
	}
	if _, err := rs.RetireSubscription(ctx, "gone", time.Hour); !errors.Is(err, driver.ErrSubscriptionLive) {
		t.Fatalf("RetireSubscription of a subscription registered just now: %v; want ErrSubscriptionLive", err)
	}
	if rec := e.inspect(t, ids[0]); rec.Status != outbox.StatusSplit || len(rec.Deliveries) != 1 {
		t.Fatalf("after a refused retire: %v, %+v", rec.Status, rec.Deliveries)
	}
	r, err := rs.RetireSubscription(ctx, "gone", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Registered || r.Dropped != 2 || r.Completed != 2 {
		t.Errorf("RetireSubscription = %+v; want registered, 2 dropped, 2 completed", r)
	}
	for _, id := range ids[:2] {
		if rec := e.inspect(t, id); rec.Status != outbox.StatusDone {
			t.Errorf("event %s after the retire: %v; want DONE", id, rec.Status)
		}
	}
	rec := e.inspect(t, ids[2])
	if rec.Status != outbox.StatusSplit || len(rec.Deliveries) != 2 {
		t.Errorf("event with gone's dead delivery and keep's NEW one after the retire: %v %+v; want split, both kept", rec.Status, rec.Deliveries)
	}
	after, err := ds.SyncSubscriptions(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if after.Version == reg.Version {
		t.Errorf("registry version %d unchanged by the retire", after.Version)
	}
	for _, st := range after.Subscriptions {
		if st.Name == "gone" {
			t.Errorf("gone is still registered after the retire")
		}
	}
	if r, err := rs.RetireSubscription(ctx, "gone", 0); err != nil || r.Registered || r.Dropped != 0 {
		t.Errorf("a second retire = %+v, %v; want not registered, nothing dropped", r, err)
	}
}
