package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.OrderedStore.DueKeys.

// DueKeys pages through the keys with due, free, NEW or RETRY ordered
// events, in order.
func testOrderDueKeys(t *testing.T, e *env) {
	ctx := context.Background()
	os := e.ordered(t)
	var keys []string
	for i := range 5 {
		k := fmt.Sprintf("k%02d", i)
		e.pubOrdered(t, k, "", blockS)
		keys = append(keys, k)
	}
	e.pubOrdered(t, "k01", "", blockS) // a second event: listed once
	e.pubOrdered(t, "held", "me", blockS)
	later, _ := e.pubOrdered(t, "later", "me", blockS)
	if err := e.store.Release(ctx, "me", []string{later}, time.Hour); err != nil {
		t.Fatal(err)
	}
	done, _ := e.pubOrdered(t, "done", "me", blockS)
	if n, err := e.store.MarkDone(ctx, "me", []string{done}, e.registry(t)); err != nil || n != 1 {
		t.Fatalf("MarkDone = %d, %v", n, err)
	}
	plain := driver.Row{ID: outbox.NewID(), Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now(), OrderingKey: "plain"}
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Insert(ctx, tx, &plain, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for page := 0; ; page++ {
		ks, err := os.DueKeys(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) > 2 {
			t.Fatalf("DueKeys(limit 2) = %v", ks)
		}
		got = append(got, ks...)
		if len(ks) < 2 || page > 10 {
			break
		}
		after = ks[len(ks)-1]
	}
	if !slices.Equal(got, keys) {
		t.Fatalf("DueKeys, two at a time = %v; want %v", got, keys)
	}
	if ks, err := os.DueKeys(ctx, "", 0); err != nil || len(ks) != 0 {
		t.Fatalf("DueKeys(limit 0) = %v, %v", ks, err)
	}
}
