package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Method-level cases of the DeliveryStore contract: each calls the store
// directly, without the engine, so that a store that breaks one promise
// fails a case that names it.

// insertRows commits n rows of type T leased to owner (or free).
func (e *env) insertRows(t *testing.T, n int, owner string, lease time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = outbox.NewID()
		r := driver.Row{ID: ids[i], Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, tx, &r, owner, lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (e *env) ds() driver.DeliveryStore { return e.store.(driver.DeliveryStore) }

// registry returns the registry's version now, for a completing write
// (MarkDone, MarkDoneKeys, Split) that must not be refused for a stale
// registry.
func (e *env) registry(t testing.TB) int64 {
	t.Helper()
	reg, err := e.ds().SyncSubscriptions(context.Background(), nil)
	if err != nil {
		t.Fatalf("SyncSubscriptions: %v", err)
	}
	return reg.Version
}

// SyncSubscriptions registers and reports; SetPaused is shared and says
// whether the name is known.
func testMethodSubscriptions(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	states, err := ds.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "a", Types: []string{string(typeA), string(typeB)}}, {Name: "all"}})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]driver.SubscriptionState{}
	for _, st := range states.Subscriptions {
		byName[st.Name] = st
	}
	if a := byName["a"]; len(a.Types) != 2 || a.Types[0] != string(typeA) || a.Paused || a.Idle > time.Minute {
		t.Fatalf("a = %+v; want types [A B], not paused, just seen", a)
	}
	if all := byName["all"]; all.Types != nil || all.Name != "all" {
		t.Fatalf("all = %+v; want nil types (every type)", all)
	}
	if ok, err := ds.SetPaused(ctx, "a", true); err != nil || !ok {
		t.Fatalf("SetPaused(a) = %v, %v; want known", ok, err)
	}
	if ok, err := ds.SetPaused(ctx, "nobody", true); err != nil || ok {
		t.Fatalf("SetPaused(nobody) = %v, %v; want unknown", ok, err)
	}
	// Another instance registering a with new types keeps it paused.
	states, err = ds.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "a", Types: []string{string(typeA)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range states.Subscriptions {
		if st.Name == "a" && (!st.Paused || len(st.Types) != 1) {
			t.Fatalf("a after re-registration = %+v; want paused, types [A]", st)
		}
	}
	if ok, err := ds.SetPaused(ctx, "a", false); err != nil || !ok {
		t.Fatalf("resume = %v, %v", ok, err)
	}
}

// Split writes only for the owner; deliveries are due after their delay.
func testMethodSplit(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 1, "me", time.Minute)
	id := ids[0]
	writes := []driver.DeliveryWrite{
		{Subscription: "now", Status: outbox.StatusNew},
		{Subscription: "later", Status: outbox.StatusRetry, Attempts: 1, Delay: time.Hour, Error: "boom"},
		{Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, Error: "fatal"},
	}
	if ok, err := ds.Split(ctx, "someone-else", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("Split by a non-owner = %v, %v; want false", ok, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusNew || len(rec.Deliveries) != 0 {
		t.Fatalf("after a refused split: %v %+v", rec.Status, rec.Deliveries)
	}
	if ok, err := ds.Split(ctx, "me", id, writes, e.registry(t)); err != nil || !ok {
		t.Fatalf("Split by the owner = %v, %v; want true", ok, err)
	}
	rec := e.inspect(t, id)
	if rec.Status != outbox.StatusSplit || rec.Owner != "" || len(rec.Deliveries) != 3 {
		t.Fatalf("after split: status %v owner %q deliveries %+v", rec.Status, rec.Owner, rec.Deliveries)
	}
	want := map[string]outbox.DeliveryRecord{
		"now":   {Subscription: "now", Status: outbox.StatusNew},
		"later": {Subscription: "later", Status: outbox.StatusRetry, Attempts: 1, LastError: "boom"},
		"gone":  {Subscription: "gone", Status: outbox.StatusDead, Attempts: 3, LastError: "fatal"},
	}
	for _, d := range rec.Deliveries {
		w := want[d.Subscription]
		if d.Status != w.Status || d.Attempts != w.Attempts || d.LastError != w.LastError || d.Owner != "" {
			t.Errorf("delivery %+v; want %+v", d, w)
		}
	}
	// Only the due one of the named subscriptions is claimed.
	got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "me", Limit: 10, Lease: time.Minute}, []string{"now", "later", "gone"}, driver.OrderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Subscription != "now" || got[0].ID != id || string(got[0].Payload) != payload || got[0].Attempts != 0 {
		t.Fatalf("ClaimDeliveries = %+v; want the due delivery to now with its event", got)
	}
	if ok, err := ds.Split(ctx, "me", id, writes, e.registry(t)); err != nil || ok {
		t.Fatalf("a second Split = %v, %v; want false (the event is split already)", ok, err)
	}
}

// Two concurrent delivery claims never return the same delivery; a lease
// keeps others off until it runs out; then the previous owner is named.
func testMethodClaimDeliveries(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 40, "me", time.Minute)
	for _, id := range ids {
		if ok, err := ds.Split(ctx, "me", id, []driver.DeliveryWrite{{Subscription: "s", Status: outbox.StatusNew}, {Subscription: "other", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for _, owner := range []string{"x", "y"} {
		wg.Go(func() {
			for {
				got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 7, Lease: 250 * time.Millisecond}, []string{"s"}, driver.OrderFilter{})
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					if d.Subscription != "s" {
						t.Errorf("claimed a delivery to %q; asked for s only", d.Subscription)
					}
					if prev, dup := seen[d.ID]; dup {
						t.Errorf("delivery %s claimed by %s and %s", d.ID, prev, owner)
					}
					seen[d.ID] = owner
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != len(ids) {
		t.Fatalf("claimed %d deliveries; want %d", len(seen), len(ids))
	}
	// Leased: nothing more now; after the lease, taken over with the
	// previous owner named.
	if got, _ := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "z", Limit: 100, Lease: time.Minute}, []string{"s"}, driver.OrderFilter{}); len(got) != 0 {
		t.Fatalf("claimed %d leased deliveries", len(got))
	}
	time.Sleep(300 * time.Millisecond) // the lease is on the database's clock: nothing to wait on
	got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "z", Limit: 100, Lease: time.Minute}, []string{"s"}, driver.OrderFilter{})
	if err != nil || len(got) != len(ids) {
		t.Fatalf("after the leases ran out: %d, %v; want %d", len(got), err, len(ids))
	}
	for _, d := range got {
		if d.PrevOwner != seen[d.ID] {
			t.Fatalf("delivery %s: previous owner %q; want %q", d.ID, d.PrevOwner, seen[d.ID])
		}
	}
}

// CompleteDeliveries, FailDelivery, ExtendDeliveryLeases and
// ReleaseDeliveries change only what the owner holds; the event is DONE
// when its last delivery is.
func testMethodDeliveryWrites(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	id := e.insertRows(t, 1, "me", time.Minute)[0]
	if ok, err := ds.Split(ctx, "me", id, []driver.DeliveryWrite{{Subscription: "a", Status: outbox.StatusNew}, {Subscription: "b", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
		t.Fatal(ok, err)
	}
	claim := func(owner string) []driver.Delivery {
		got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: owner, Limit: 10, Lease: time.Minute}, []string{"a", "b"}, driver.OrderFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claim("me"); len(got) != 2 {
		t.Fatalf("claimed %d; want 2", len(got))
	}
	ka, kb := driver.DeliveryKey{EventID: id, Subscription: "a"}, driver.DeliveryKey{EventID: id, Subscription: "b"}
	if n, err := ds.CompleteDeliveries(ctx, "intruder", []driver.DeliveryKey{ka}); err != nil || n != 0 {
		t.Fatalf("CompleteDeliveries by a non-owner = %d, %v; want 0", n, err)
	}
	if n, err := ds.ExtendDeliveryLeases(ctx, "me", []driver.DeliveryKey{ka, kb}, time.Minute); err != nil || n != 2 {
		t.Fatalf("ExtendDeliveryLeases = %d, %v; want 2", n, err)
	}
	if n, err := ds.CompleteDeliveries(ctx, "me", []driver.DeliveryKey{ka}); err != nil || n != 1 {
		t.Fatalf("CompleteDeliveries(a) = %d, %v; want 1", n, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusSplit {
		t.Fatalf("event %v with b still owed; want split", rec.Status)
	}
	if ok, err := ds.FailDelivery(ctx, "intruder", kb, driver.DeliveryWrite{Status: outbox.StatusRetry, Attempts: 1, Error: "x"}); err != nil || ok {
		t.Fatalf("FailDelivery by a non-owner = %v, %v; want false", ok, err)
	}
	if ok, err := ds.FailDelivery(ctx, "me", kb, driver.DeliveryWrite{Status: outbox.StatusRetry, Attempts: 1, Error: "first"}); err != nil || !ok {
		t.Fatalf("FailDelivery = %v, %v", ok, err)
	}
	// Due at once (no delay): claim it again, defer it without an
	// attempt, and check the error is kept.
	if got := claim("me"); len(got) != 1 || got[0].Attempts != 1 || got[0].Status != outbox.StatusRetry {
		t.Fatalf("reclaimed %+v; want b at 1 attempt", got)
	}
	if ok, err := ds.FailDelivery(ctx, "me", kb, driver.DeliveryWrite{Status: outbox.StatusNew, Attempts: 1}); err != nil || !ok {
		t.Fatalf("defer = %v, %v", ok, err)
	}
	rec := e.inspect(t, id)
	if d := rec.Deliveries[1]; d.Subscription != "b" || d.Status != outbox.StatusNew || d.Attempts != 1 || d.LastError != "first" || len(d.History) != 1 {
		t.Fatalf("b after a deferral: %+v; want NEW, 1 attempt, last error kept, one attempt in the history", d)
	}
	if got := claim("me"); len(got) != 1 {
		t.Fatalf("reclaimed %d; want b", len(got))
	}
	if err := ds.ReleaseDeliveries(ctx, "nobody", []driver.DeliveryKey{kb}, 0); err != nil {
		t.Fatal(err)
	}
	if got := claim("other"); len(got) != 0 {
		t.Fatal("a release by a non-owner freed the delivery")
	}
	if err := ds.ReleaseDeliveries(ctx, "me", []driver.DeliveryKey{kb}, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := claim("me"); len(got) != 0 {
		t.Fatalf("claimed %d right after a release with a delay", len(got))
	}
	time.Sleep(250 * time.Millisecond) // the delay is on the database's clock: nothing to wait on
	if got := claim("me"); len(got) != 1 {
		t.Fatalf("claimed %d after the delay; want b", len(got))
	}
	if n, err := ds.CompleteDeliveries(ctx, "me", []driver.DeliveryKey{kb}); err != nil || n != 1 {
		t.Fatalf("CompleteDeliveries(b) = %d, %v", n, err)
	}
	if rec := e.inspect(t, id); rec.Status != outbox.StatusDone {
		t.Fatalf("event %v after its last delivery; want DONE", rec.Status)
	}
}

// DueNow makes the unleased, deferred deliveries of one subscription due
// at once, and no other.
func testMethodDueNow(t *testing.T, e *env) {
	ctx := context.Background()
	ds := e.ds()
	ids := e.insertRows(t, 2, "me", time.Minute)
	for _, id := range ids {
		if ok, err := ds.Split(ctx, "me", id, []driver.DeliveryWrite{
			{Subscription: "down", Status: outbox.StatusNew, Delay: time.Hour},
			{Subscription: "other", Status: outbox.StatusNew, Delay: time.Hour},
		}, e.registry(t)); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	claim := func(sub string) int {
		got, err := ds.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "me", Limit: 10, Lease: time.Minute}, []string{sub}, driver.OrderFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	if n := claim("down"); n != 0 {
		t.Fatalf("claimed %d deferred deliveries before DueNow", n)
	}
	if n, err := ds.DueNow(ctx, "down"); err != nil || n != 2 {
		t.Fatalf("DueNow = %d, %v; want 2", n, err)
	}
	if n := claim("down"); n != 2 {
		t.Fatalf("claimed %d after DueNow; want 2", n)
	}
	if n := claim("other"); n != 0 {
		t.Fatalf("DueNow of one subscription made %d of another's due", n)
	}
	if n, err := ds.DueNow(ctx, "down"); err != nil || n != 0 {
		t.Fatalf("DueNow on leased deliveries = %d, %v; want 0", n, err)
	}
}
