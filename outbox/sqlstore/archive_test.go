package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// archivedRow is what the archive holds of one event.
type archivedRow struct {
	Status      int
	DeliveredBy string
	HasTime     bool
}

// archived returns the archive's rows of id.
func archived(t *testing.T, st *sqlstore.Store, id string) []archivedRow {
	t.Helper()
	rs, err := st.DB().Query(st.DB().Rebind(`SELECT status, delivered_by, delivered_at IS NOT NULL AND done_at IS NOT NULL FROM `+st.ArchiveTable()+` WHERE id = ?`), id)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []archivedRow
	for rs.Next() {
		var r archivedRow
		if err := rs.Scan(&r.Status, &r.DeliveredBy, &r.HasTime); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// inTable counts the event table's rows of id.
func inTable(t *testing.T, st *sqlstore.Store, id string) int {
	t.Helper()
	var n int
	if err := st.DB().Get(&n, st.DB().Rebind(`SELECT COUNT(*) FROM `+st.Table()+` WHERE id = ?`), id); err != nil {
		t.Fatal(err)
	}
	return n
}

// countWhere counts the rows of table whose event_id is id.
func countEventRows(t *testing.T, st *sqlstore.Store, table, id string) int {
	t.Helper()
	var n int
	if err := st.DB().Get(&n, st.DB().Rebind(`SELECT COUNT(*) FROM `+table+` WHERE event_id = ?`), id); err != nil {
		t.Fatal(err)
	}
	return n
}

// backdate moves the archived rows of ids (all of them if none) days
// into the past.
func backdate(t *testing.T, st *sqlstore.Store, days int, ids ...string) {
	t.Helper()
	shift := map[string]string{
		"mysql":    fmt.Sprintf("delivered_at - INTERVAL %d DAY", days),
		"postgres": fmt.Sprintf("delivered_at - INTERVAL '%d days'", days),
		"sqlite":   fmt.Sprintf("delivered_at - %d", int64(days)*24*3600*1_000_000),
	}[st.Dialect().Name()]
	q, args := `UPDATE `+st.ArchiveTable()+` SET delivered_at = `+shift, []any(nil)
	if len(ids) > 0 {
		q += ` WHERE id IN (?` + strings.Repeat(", ?", len(ids)-1) + `)`
		for _, id := range ids {
			args = append(args, id)
		}
	}
	st.DB().MustExec(st.DB().Rebind(q), args...)
}

func publishEvents(t *testing.T, db *sqlx.DB, ob *outbox.Outbox, envs ...outbox.Envelope) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, env := range envs {
		id, err := ob.PublishTx(ctx, tx, env)
		if err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// In archive mode every way an event is completed moves it into the
// archive, with when and by whom it was delivered, and out of the table:
// a plain delivery (MarkDone), an ordered one (MarkDoneKeys), a Tx
// subscription's (DeliverInTx, then MarkDone), the last delivery of a
// split event (CompleteDeliveries) and a Tx subscription's last delivery
// of a split event (DeliverInTx). Inspect finds each in the archive, a
// split one with its deliveries; the archive's cleanup takes those
// delivery records along.
func TestArchiveModeArchivesEveryWayAnEventIsCompleted(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
			effects := effectsTable(t, db)
			var failed sync.Map
			firstFails := func(sub string, ev outbox.Event) error {
				if _, again := failed.LoadOrStore(sub+"/"+ev.ID, true); !again {
					return errors.New("the first try fails")
				}
				return nil
			}
			ok := func(context.Context, outbox.Event) error { return nil }
			fast := outbox.RetryFunc(func(int) time.Duration { return 10 * time.Millisecond })
			txProject := project(effects, "archiver", nil)
			ob := startOrdered(t, st, outbox.Config{InstanceID: "archiver", PollInterval: 20 * time.Millisecond, PollMaxInterval: 20 * time.Millisecond},
				outbox.Subscription{Name: "plain", Types: []outbox.EventType{"Plain"}, Handler: ok},
				outbox.Subscription{Name: "ordered", Types: []outbox.EventType{"Keyed"}, Order: outbox.Ordered, Handler: ok},
				outbox.Subscription{Name: "tx", Types: []outbox.EventType{"TxOnly"}, Tx: txProject},
				outbox.Subscription{Name: "steady", Types: []outbox.EventType{"Split", "TxSplit"}, Handler: ok},
				outbox.Subscription{Name: "flaky", Types: []outbox.EventType{"Split"}, Retry: fast,
					Handler: func(_ context.Context, ev outbox.Event) error { return firstFails("flaky", ev) }},
				outbox.Subscription{Name: "flaky-tx", Types: []outbox.EventType{"TxSplit"}, Retry: fast,
					Tx: func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
						if err := firstFails("flaky-tx", ev); err != nil {
							return err
						}
						return txProject(ctx, tx, ev)
					}},
			)
			ids := publishEvents(t, db, ob,
				outbox.Envelope{Type: "Plain", AggregateType: "Order", AggregateID: "1", JSON: []byte(`{}`)},
				outbox.Envelope{Type: "Keyed", AggregateType: "Order", AggregateID: "2", JSON: []byte(`{}`)},
				outbox.Envelope{Type: "Keyed", AggregateType: "Order", AggregateID: "2", JSON: []byte(`{}`)},
				outbox.Envelope{Type: "TxOnly", JSON: []byte(`{}`)},
				outbox.Envelope{Type: "Split", JSON: []byte(`{}`)},
				outbox.Envelope{Type: "TxSplit", JSON: []byte(`{}`)},
			)
			split, txSplit := ids[4], ids[5]
			waitUntil(t, 30*time.Second, "every event archived", func() bool {
				for _, id := range ids {
					if len(archived(t, st, id)) == 0 {
						return false
					}
				}
				return true
			})
			ctx := context.Background()
			for i, id := range ids {
				if got := archived(t, st, id); len(got) != 1 || got[0] != (archivedRow{Status: 1, DeliveredBy: "archiver", HasTime: true}) {
					t.Errorf("event %d (%s): archive rows %+v; want one, DONE, delivered by archiver, with delivered_at and done_at", i, id, got)
				}
				if n := inTable(t, st, id); n != 0 {
					t.Errorf("event %d (%s): %d rows left in the table; want it moved to the archive", i, id, n)
				}
				rec, err := st.Inspect(ctx, id)
				if err != nil || !rec.Archived() || rec.DeliveredBy != "archiver" || rec.Status != outbox.StatusDone {
					t.Errorf("Inspect(event %d) = archived %v by %q, status %v, %v; want archived by archiver, DONE", i, rec.Archived(), rec.DeliveredBy, rec.Status, err)
				}
			}
			for _, id := range []string{ids[3], txSplit} {
				if n := effectCount(t, db, effects, id); n != 1 {
					t.Errorf("Tx event %s: %d effects; want 1", id, n)
				}
			}
			rec, err := st.Inspect(ctx, split)
			if err != nil || len(rec.Deliveries) != 1 || rec.Deliveries[0].Subscription != "flaky" || rec.Deliveries[0].Status != outbox.StatusDone || len(rec.Deliveries[0].History) != 1 {
				t.Errorf("Inspect(split event) deliveries %+v, %v; want flaky's, DONE after one failed attempt", rec.Deliveries, err)
			}

			// The archive's retention takes the split event's delivery
			// records along, and nothing newer.
			backdate(t, st, 2, split)
			if n, err := st.CleanupArchive(ctx, time.Hour, 100); err != nil || n != 1 {
				t.Fatalf("CleanupArchive = %d, %v; want the one event delivered two days ago", n, err)
			}
			if got := archived(t, st, split); len(got) != 0 {
				t.Errorf("split event still archived after the cleanup: %+v", got)
			}
			for _, tbl := range []string{st.DeliveriesTable(), st.AttemptsTable()} {
				if n := countEventRows(t, st, tbl, split); n != 0 {
					t.Errorf("%d rows of the cleaned-up event left in %s", n, tbl)
				}
			}
			if n := countEventRows(t, st, st.DeliveriesTable(), txSplit); n == 0 {
				t.Errorf("the delivery records of the Tx split event, archived just now, are gone")
			}
		})
	}
}

// insertLeased inserts n events of type typ leased to owner.
func insertLeased(t *testing.T, st *sqlstore.Store, owner string, rows ...driver.Row) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, st.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range rows {
		r := rows[i]
		r.ID = outbox.NewID()
		r.Payload, r.PayloadJSON, r.OccurredAt = []byte(`{}`), true, time.Now()
		if err := st.Insert(ctx, tx, &r, owner, time.Minute); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// A completion whose lease is lost, or whose registry version is not the
// store's, archives nothing and leaves the event in the table; the
// owner's completion archives it once. The same for the last delivery of
// a split event.
func TestArchiveFencedByLeaseAndRegistry(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
			ctx := context.Background()
			reg, err := st.SyncSubscriptions(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids := insertLeased(t, st, "a", driver.Row{Type: "Plain"}, driver.Row{Type: "Plain"})
			if n, err := st.MarkDone(ctx, "b", ids, reg.Version); err != nil || n != 0 {
				t.Fatalf("MarkDone by another owner = %d, %v; want 0, nil", n, err)
			}
			if n, err := st.MarkDone(ctx, "a", ids, reg.Version+1); !errors.Is(err, driver.ErrRegistryChanged) || n != 0 {
				t.Fatalf("MarkDone with a stale registry version = %d, %v; want 0, ErrRegistryChanged", n, err)
			}
			for _, id := range ids {
				if got, n := archived(t, st, id), inTable(t, st, id); len(got) != 0 || n != 1 {
					t.Fatalf("after fenced completions: %d archived, %d in the table; want 0 and 1", len(got), n)
				}
			}
			if n, err := st.MarkDone(ctx, "a", ids, reg.Version); err != nil || n != 2 {
				t.Fatalf("MarkDone by the owner = %d, %v; want 2", n, err)
			}
			if n, err := st.MarkDone(ctx, "a", ids, reg.Version); err != nil || n != 0 {
				t.Fatalf("MarkDone again = %d, %v; want 0", n, err)
			}
			for _, id := range ids {
				if got := archived(t, st, id); len(got) != 1 || got[0].DeliveredBy != "a" {
					t.Errorf("archive rows of %s: %+v; want one delivered by a", id, got)
				}
			}

			// A split event's last delivery.
			id := insertLeased(t, st, "me", driver.Row{Type: "Plain"})[0]
			if ok, err := splitOne(ctx, st, "me", id, []driver.DeliveryWrite{{Subscription: "s", Status: outbox.StatusNew}}, reg.Version); err != nil || !ok {
				t.Fatalf("Split = %v, %v", ok, err)
			}
			got, err := st.ClaimDeliveries(ctx, driver.ClaimRequest{Owner: "c", Limit: 10, Lease: time.Minute}, []string{"s"}, driver.OrderFilter{})
			if err != nil || len(got) != 1 {
				t.Fatalf("ClaimDeliveries = %d, %v; want the split event's delivery", len(got), err)
			}
			key := []driver.DeliveryID{{EventID: id, Subscription: "s"}}
			if n, err := st.CompleteDeliveries(ctx, "d", key); err != nil || n != 0 {
				t.Fatalf("CompleteDeliveries by another owner = %d, %v; want 0", n, err)
			}
			if got, n := archived(t, st, id), inTable(t, st, id); len(got) != 0 || n != 1 {
				t.Fatalf("split event after a fenced completion: %d archived, %d in the table; want 0 and 1", len(got), n)
			}
			if n, err := st.CompleteDeliveries(ctx, "c", key); err != nil || n != 1 {
				t.Fatalf("CompleteDeliveries by the owner = %d, %v; want 1", n, err)
			}
			if got, n := archived(t, st, id), inTable(t, st, id); len(got) != 1 || got[0].DeliveredBy != "c" || n != 0 {
				t.Errorf("split event after its last delivery: archive %+v, %d in the table; want archived by c, not in the table", got, n)
			}
		})
	}
}

// archiveRows archives one event per row, by "a".
func archiveRows(t *testing.T, st *sqlstore.Store, rows ...driver.Row) []string {
	t.Helper()
	ctx := context.Background()
	reg, err := st.SyncSubscriptions(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := insertLeased(t, st, "a", rows...)
	if n, err := st.MarkDone(ctx, "a", ids, reg.Version); err != nil || n != len(ids) {
		t.Fatalf("MarkDone = %d, %v; want %d", n, err, len(ids))
	}
	return ids
}

// The archive's retention deletes only the rows delivered before the
// cut-off, at most limit a call, oldest first; the event table is not
// touched.
func TestArchiveCleanupDeletesOnlyOldRowsInBatches(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
			ctx := context.Background()
			old := archiveRows(t, st, make([]driver.Row, 5)...)
			for i := range old {
				backdate(t, st, 10-i, old[i]) // old[0] the oldest
			}
			recent := archiveRows(t, st, make([]driver.Row, 2)...)
			pending := insertLeased(t, st, "", driver.Row{Type: "Plain"})[0]
			for i, want := range []int64{2, 2, 1, 0} {
				n, err := st.CleanupArchive(ctx, 24*time.Hour, 2)
				if err != nil || n != want {
					t.Fatalf("CleanupArchive #%d = %d, %v; want %d", i+1, n, err, want)
				}
				if i == 0 {
					if len(archived(t, st, old[0])) != 0 || len(archived(t, st, old[1])) != 0 || len(archived(t, st, old[2])) != 1 {
						t.Errorf("the first batch did not take the two oldest")
					}
				}
			}
			for _, id := range recent {
				if len(archived(t, st, id)) != 1 {
					t.Errorf("recent archived event %s deleted", id)
				}
			}
			if inTable(t, st, pending) != 1 {
				t.Errorf("the pending event was deleted by the archive's cleanup")
			}
			if _, err := st.CleanupArchive(ctx, time.Hour, 0); err == nil {
				t.Errorf("CleanupArchive with limit 0: no error")
			}
		})
	}
}

// SearchArchive finds archived events by id, type, aggregate type and
// aggregate, in id order, a page at a time.
func TestSearchArchive(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
			ctx := context.Background()
			ids := archiveRows(t, st,
				driver.Row{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "1"},
				driver.Row{Type: "OrderShipped", AggregateType: "Order", AggregateID: "1"},
				driver.Row{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "2"},
				driver.Row{Type: "UserCreated", AggregateType: "User", AggregateID: "1"},
			)
			notArchived := insertLeased(t, st, "", driver.Row{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "1"})[0]
			for _, c := range []struct {
				q    driver.ArchiveQuery
				want []string
			}{
				{driver.ArchiveQuery{}, ids},
				{driver.ArchiveQuery{ID: ids[2]}, ids[2:3]},
				{driver.ArchiveQuery{ID: notArchived}, nil},
				{driver.ArchiveQuery{Type: "OrderPlaced"}, []string{ids[0], ids[2]}},
				{driver.ArchiveQuery{AggregateType: "Order"}, ids[:3]},
				{driver.ArchiveQuery{AggregateType: "Order", AggregateID: "1"}, ids[:2]},
				{driver.ArchiveQuery{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "1"}, ids[:1]},
				{driver.ArchiveQuery{Limit: 2}, ids[:2]},
				{driver.ArchiveQuery{After: ids[1], Limit: 2}, ids[2:4]},
			} {
				got, err := st.SearchArchive(ctx, c.q)
				if err != nil {
					t.Fatalf("SearchArchive(%+v): %v", c.q, err)
				}
				var gotIDs []string
				for _, e := range got {
					gotIDs = append(gotIDs, e.ID)
					if e.DeliveredBy != "a" || e.DeliveredAt.IsZero() || e.CreatedAt.IsZero() {
						t.Errorf("SearchArchive(%+v): %+v; want delivered by a, with its times", c.q, e)
					}
				}
				if fmt.Sprint(gotIDs) != fmt.Sprint(c.want) {
					t.Errorf("SearchArchive(%+v) = %v; want %v", c.q, gotIDs, c.want)
				}
			}
			for _, q := range []driver.ArchiveQuery{{AggregateID: "1"}, {Limit: -1}, {Limit: 1001}} {
				if _, err := st.SearchArchive(ctx, q); err == nil {
					t.Errorf("SearchArchive(%+v): no error", q)
				}
			}
		})
	}
}

// New refuses DeleteDelivered with ArchiveDelivered, naming both.
func TestNewRefusesDeleteAndArchiveDelivered(t *testing.T) {
	db := testdb.SQLite(t)
	_, err := sqlstore.New(db, sqlstore.Options{DeleteDelivered: true, ArchiveDelivered: true})
	if err == nil || !strings.Contains(err.Error(), "DeleteDelivered") || !strings.Contains(err.Error(), "ArchiveDelivered") {
		t.Fatalf("New with both = %v; want an error naming both options", err)
	}
}

// cleanedSignal reports each cleanup batch's count.
type cleanedSignal struct {
	outbox.NopMetrics
	ch chan int64
}

func (m cleanedSignal) Cleaned(n int64) { m.ch <- n }

// Config.ArchiveRetention makes the engine's cleaner delete the archived
// events delivered before it, in batches of CleanupBatchSize, at Start;
// newer ones and the table's rows stay.
func TestArchiveRetentionCleansTheArchiveAtStart(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
			old := archiveRows(t, st, make([]driver.Row, 5)...)
			backdate(t, st, 3, old...)
			recent := archiveRows(t, st, make([]driver.Row, 2)...)
			m := cleanedSignal{ch: make(chan int64, 10)}
			startOrdered(t, st, outbox.Config{ArchiveRetention: 48 * time.Hour, CleanupBatchSize: 2, Metrics: m, DisablePoller: true},
				outbox.Subscription{Name: "any", Handler: func(context.Context, outbox.Event) error { return nil }})
			var batches []int64
			for n := int64(2); n == 2; {
				select {
				case n = <-m.ch:
					batches = append(batches, n)
				case <-time.After(30 * time.Second):
					t.Fatalf("no cleanup batch in 30s (batches so far %v)", batches)
				}
			}
			if fmt.Sprint(batches) != "[2 2 1]" {
				t.Errorf("cleanup batches %v; want [2 2 1]", batches)
			}
			for _, id := range old {
				if len(archived(t, st, id)) != 0 {
					t.Errorf("archived event %s delivered 3 days ago kept past a 48h retention", id)
				}
			}
			for _, id := range recent {
				if len(archived(t, st, id)) != 1 {
					t.Errorf("archived event %s delivered just now deleted", id)
				}
			}
		})
	}
}
