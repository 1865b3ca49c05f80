package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.DeliveryStore.SyncSubscriptions and SetPaused, and of
// the registry version that fences the completing writes.

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

// The registry's version changes when a subscription is recorded that was
// not known, or one's types widen, and not otherwise; a completing write
// (MarkDone, Split, MarkDoneKeys) made with an older version changes
// nothing and reports driver.ErrRegistryChanged; with the current one it
// works.
func testMethodRegistryFence(t *testing.T, e *env) {
	ctx := context.Background()
	ids := e.insertRows(t, 3, "me", minute)
	v1, v2 := registryVersions(t, e)
	testFencedWrites(t, e, ids, v1, v2)
	os, ordered := e.store.(driver.OrderedStore)
	if !ordered {
		return
	}
	k1, _ := e.pubOrdered(t, "k", "me", blockS)
	kd := keyDone(t, e, k1)
	n, _, err := os.MarkDoneKeys(ctx, "me", []string{k1}, []driver.KeyDone{kd}, v1)
	if !errors.Is(err, driver.ErrRegistryChanged) || n != 0 {
		t.Fatalf("MarkDoneKeys with a stale registry = %d, %v; want 0, ErrRegistryChanged", n, err)
	}
	if rec := e.inspect(t, k1); rec.Status != outbox.StatusNew || rec.Owner != "me" {
		t.Fatalf("after a refused MarkDoneKeys: status %v owner %q", rec.Status, rec.Owner)
	}
	if n, _, err := os.MarkDoneKeys(ctx, "me", []string{k1}, []driver.KeyDone{kd}, v2); err != nil || n != 1 {
		t.Fatalf("MarkDoneKeys with the current registry = %d, %v; want 1", n, err)
	}
}

// registryVersions registers a subscription, then changes it, checking
// which changes move the registry's version; it returns a stale version
// and the current one.
func registryVersions(t *testing.T, e *env) (stale, current int64) {
	ctx := context.Background()
	ds := e.ds()
	sync := func(subs ...driver.SubscriptionInfo) int64 {
		t.Helper()
		reg, err := ds.SyncSubscriptions(ctx, subs)
		if err != nil {
			t.Fatal(err)
		}
		return reg.Version
	}
	a := func(types ...string) driver.SubscriptionInfo { return driver.SubscriptionInfo{Name: "a", Types: types} }
	v0 := sync()
	v1 := sync(a(string(typeA)))
	if v1 == v0 {
		t.Fatalf("version %d after a new subscription; want a change", v1)
	}
	if v := sync(a(string(typeA))); v != v1 {
		t.Fatalf("version %d after the same registration again; want %d", v, v1)
	}
	v2 := sync(a(string(typeA), string(typeB)))
	if v2 == v1 {
		t.Fatalf("version %d after widening a's types; want a change", v2)
	}
	if v := sync(a(string(typeA))); v != v2 {
		t.Fatalf("version %d after narrowing a's types; want %d (no change)", v, v2)
	}
	if v := sync(a(string(typeA)), driver.SubscriptionInfo{Name: "all"}); v == v2 {
		t.Fatal("no change after a new subscription of every type")
	} else {
		v2 = v
	}
	if v := sync(a()); v == v2 {
		t.Fatal("no change after widening a to every type")
	} else {
		v2 = v
	}
	return v1, v2
}

// testFencedWrites checks MarkDone and Split on ids (NEW, leased to
// "me") with the stale registry version v1, then with the current v2.
func testFencedWrites(t *testing.T, e *env, ids []string, v1, v2 int64) {
	ctx := context.Background()
	ds := e.ds()
	// Stale: nothing changes.
	n, err := e.store.MarkDone(ctx, "me", ids[:1], v1)
	if !errors.Is(err, driver.ErrRegistryChanged) || n != 0 {
		t.Fatalf("MarkDone with a stale registry = %d, %v; want 0, ErrRegistryChanged", n, err)
	}
	writes := []driver.DeliveryWrite{{Subscription: "a", Status: outbox.StatusNew}}
	ok, err := splitOne(ctx, ds, "me", ids[1], writes, v1)
	if !errors.Is(err, driver.ErrRegistryChanged) || ok {
		t.Fatalf("Split with a stale registry = %v, %v; want false, ErrRegistryChanged", ok, err)
	}
	for _, id := range ids[:2] {
		if rec := e.inspect(t, id); rec.Status != outbox.StatusNew || rec.Owner != "me" || len(rec.Deliveries) != 0 {
			t.Fatalf("after a refused write: status %v owner %q deliveries %+v; want new, still leased to me, none", rec.Status, rec.Owner, rec.Deliveries)
		}
	}
	// A lost lease with the current registry is no refusal.
	if n, err := e.store.MarkDone(ctx, "someone-else", ids[:1], v2); err != nil || n != 0 {
		t.Fatalf("MarkDone by a non-owner = %d, %v; want 0, nil", n, err)
	}
	// Current: they work.
	if n, err := e.store.MarkDone(ctx, "me", ids[:1], v2); err != nil || n != 1 {
		t.Fatalf("MarkDone with the current registry = %d, %v; want 1", n, err)
	}
	if ok, err := splitOne(ctx, ds, "me", ids[1], writes, v2); err != nil || !ok {
		t.Fatalf("Split with the current registry = %v, %v; want true", ok, err)
	}
	if rec := e.inspect(t, ids[1]); rec.Status != outbox.StatusSplit || len(rec.Deliveries) != 1 {
		t.Fatalf("after split: status %v deliveries %+v", rec.Status, rec.Deliveries)
	}
}
