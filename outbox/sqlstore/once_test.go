package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// deliveries counts the handler calls per event id.
type deliveries struct {
	mu  sync.Mutex
	n   map[string]int
	got []string
}

func (d *deliveries) handle(ctx context.Context, ev outbox.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[ev.ID]++
	d.got = append(d.got, ev.ID)
	return nil
}

func (d *deliveries) count(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[id]
}

// PublishOnce of an id that exists writes nothing and leaves the
// transaction usable (on PostgreSQL an error would abort it): the same
// transaction publishes another event and commits, and each event is
// delivered once. Unordered and ordered events alike (an ordered one's
// key goes on after the refused publish).
func TestPublishOnceOfAnExistingIDLeavesTheTransactionUsable(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			var plain, ordered deliveries
			ob := startOrdered(t, st, outbox.Config{PollInterval: 20 * time.Millisecond, PollMaxInterval: 20 * time.Millisecond},
				outbox.Subscription{Name: "plain", Types: []outbox.EventType{"Plain"}, Handler: plain.handle},
				outbox.Subscription{Name: "ordered", Types: []outbox.EventType{"Keyed"}, Order: outbox.Ordered, Handler: ordered.handle})
			ctx := context.Background()
			for _, c := range []struct {
				env outbox.Envelope
				d   *deliveries
			}{
				{outbox.Envelope{ID: "order-1-placed", Type: "Plain", JSON: []byte(`{}`)}, &plain},
				{outbox.Envelope{ID: "order-2-placed", Type: "Keyed", AggregateType: "Order", AggregateID: "2", JSON: []byte(`{}`)}, &ordered},
			} {
				once := func(env outbox.Envelope, also *outbox.Envelope) (bool, string) {
					t.Helper()
					tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
					if err != nil {
						t.Fatal(err)
					}
					existed, err := ob.PublishOnceTx(ctx, tx, env)
					if err != nil {
						tx.Rollback()
						t.Fatalf("PublishOnce %s: %v", env.ID, err)
					}
					var next string
					if also != nil {
						if next, err = ob.PublishTx(ctx, tx, *also); err != nil {
							tx.Rollback()
							t.Fatalf("publish after PublishOnce of %s (existed %v) in the same transaction: %v", env.ID, existed, err)
						}
					}
					if err := tx.Commit(); err != nil {
						t.Fatalf("commit after PublishOnce of %s (existed %v): %v", env.ID, existed, err)
					}
					return existed, next
				}
				if existed, _ := once(c.env, nil); existed {
					t.Fatalf("first PublishOnce of %s: existed; want written", c.env.ID)
				}
				later := c.env
				later.ID = ""
				existed, next := once(c.env, &later)
				if !existed {
					t.Fatalf("second PublishOnce of %s: not existed; want refused", c.env.ID)
				}
				waitUntil(t, 30*time.Second, "both events delivered", func() bool { return c.d.count(c.env.ID) > 0 && c.d.count(next) > 0 })
				if n := c.d.count(c.env.ID); n != 1 {
					t.Errorf("event %s delivered %d times; want once", c.env.ID, n)
				}
			}
			ordered.mu.Lock()
			defer ordered.mu.Unlock()
			if len(ordered.got) != 2 || ordered.got[0] != "order-2-placed" {
				t.Errorf("key Order:2 delivered as %v; want order-2-placed, then the event published after the refused one", ordered.got)
			}
		})
	}
}

// A PublishOnce waits for a concurrent transaction that wrote the id:
// refused if that one commits, written if it rolls back.
func TestPublishOnceWaitsForAConcurrentWriterOfTheID(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ob := startOrdered(t, st, outbox.Config{}, outbox.Subscription{Name: "plain", Handler: func(context.Context, outbox.Event) error { return nil }})
			ctx := context.Background()
			for _, commitFirst := range []bool{true, false} {
				id := outbox.NewID()
				env := outbox.Envelope{ID: id, Type: "Plain", JSON: []byte(`{}`)}
				first, err := outbox.BeginTx(ctx, st.DB().DB, nil)
				if err != nil {
					t.Fatal(err)
				}
				if existed, err := ob.PublishOnceTx(ctx, first, env); err != nil || existed {
					t.Fatalf("first writer: existed %v, %v", existed, err)
				}
				type result struct {
					existed bool
					err     error
				}
				second := make(chan result, 1)
				go func() {
					tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
					if err != nil {
						second <- result{err: err}
						return
					}
					existed, err := ob.PublishOnceTx(ctx, tx, env)
					if err == nil {
						err = tx.Commit()
					} else {
						tx.Rollback()
					}
					second <- result{existed, err}
				}()
				select {
				case r := <-second:
					t.Fatalf("second writer returned (existed %v, %v) while the first was open; want it to wait", r.existed, r.err)
				case <-time.After(200 * time.Millisecond):
				}
				if commitFirst {
					err = first.Commit()
				} else {
					err = first.Rollback()
				}
				if err != nil {
					t.Fatal(err)
				}
				r := <-second
				if r.err != nil || r.existed != commitFirst {
					t.Errorf("first writer committed %v: second got existed %v, %v; want existed %v", commitFirst, r.existed, r.err, commitFirst)
				}
				if rec, err := st.Inspect(ctx, id); err != nil {
					t.Errorf("event %s: %v; want it written once", id, err)
				} else if rec.ID != id {
					t.Errorf("event %s read as %s", id, rec.ID)
				}
			}
		})
	}
}

// PublishOnce on a partitioned MySQL table is refused with an error that
// says why and what to do, and writes nothing.
func TestPublishOnceIsRefusedOnAPartitionedTable(t *testing.T) {
	db := testdb.Open(t, "mysql")
	st := testdb.Store(t, db)
	ctx := context.Background()
	if err := st.Partition(ctx, sqlstore.PartitionConfig{Ahead: 1}); err != nil {
		t.Fatal(err)
	}
	ob := startOrdered(t, st, outbox.Config{})
	tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	existed, err := ob.PublishOnceTx(ctx, tx, outbox.Envelope{ID: "order-1-placed", Type: "Plain", JSON: []byte(`{}`)})
	if !errors.Is(err, sqlstore.ErrOnceOnPartitioned) || existed {
		t.Fatalf("PublishOnce on a partitioned table: existed %v, %v; want %v", existed, err, sqlstore.ErrOnceOnPartitioned)
	}
	if _, err := st.Inspect(ctx, "order-1-placed"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("the refused event: %v; want not written", err)
	}
}
