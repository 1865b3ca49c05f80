package inbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/inbox"
)

// Each statement of Cleanup deletes at most CleanupBatch rows, only
// expired applied or purged ones, and finds them through the index on
// (status, received_at): the plan of the batch is a range scan of that
// index (MariaDB and MySQL: EXPLAIN DELETE gives type range on it;
// PostgreSQL, where a table this small is scanned whole, with sequential
// scans off; SQLite: EXPLAIN QUERY PLAN searches it), so a batch reads the
// rows it deletes, not the table.
func TestCleanupDeletesInBoundedBatchesOnTheAgeIndex(t *testing.T) {
	eachDB(t, inbox.Config{Retention: 3600e9, CleanupBatch: 10, MaxAttempts: 1}, func(t *testing.T, e *env) {
		ctx := context.Background()
		ok := func(context.Context, inbox.Message) error { return nil }
		for i := range 25 {
			id := fmt.Sprintf("old%02d", i)
			res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: id}, ok)
			mustResult(t, res, err, inbox.Applied)
			e.age(t, id, false)
		}
		res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: "young"}, ok)
		mustResult(t, res, err, inbox.Applied)
		res, _ = e.ib.Handle(ctx, "c", inbox.Message{ID: "parked"}, e.failing(errBoom))
		mustResult(t, res, nil, inbox.Parked)
		e.age(t, "parked", false)

		e.wantAgeIndex(t)
		var got []int64
		for {
			n, err := e.ib.ExpireBatch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, n)
			if n < 10 {
				break
			}
		}
		if fmt.Sprint(got) != "[10 10 5]" {
			t.Errorf("rows deleted per batch: %v, want [10 10 5]", got)
		}
		var left []string
		if err := e.db.Select(&left, "SELECT message_id FROM "+e.store.InboxTable()+" ORDER BY message_id"); err != nil {
			t.Fatal(err)
		}
		if strings.Join(left, ",") != "parked,young" {
			t.Errorf("rows after the batches: %v, want parked,young", left)
		}
	})
}

// wantAgeIndex checks that the plan of a cleanup batch scans a range of
// the inbox's age index.
func (e *env) wantAgeIndex(t *testing.T) {
	t.Helper()
	q, args := e.ib.ExpireSQL()
	index := strings.Trim(e.store.Table(), "`\"") + "_inbox_age"
	if i := strings.LastIndexByte(index, '.'); i >= 0 {
		index = index[i+1:]
	}
	switch e.name {
	case "mysql":
		var plan []struct {
			Type string  `db:"type"`
			Key  *string `db:"key"`
		}
		if err := e.db.Unsafe().Select(&plan, "EXPLAIN "+q, args...); err != nil {
			t.Fatal(err)
		}
		if len(plan) != 1 || plan[0].Type != "range" || plan[0].Key == nil || *plan[0].Key != index {
			t.Errorf("EXPLAIN of a cleanup batch: %+v, want one range scan of %s", plan, index)
		}
	case "postgres":
		tx := e.db.MustBegin()
		defer tx.Rollback()
		tx.MustExec("SET LOCAL enable_seqscan = off")
		var lines []string
		if err := tx.Select(&lines, "EXPLAIN "+q, args...); err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if !strings.Contains(plan, "Index") || !strings.Contains(plan, index) || !strings.Contains(plan, "received_at <") {
			t.Errorf("EXPLAIN of a cleanup batch does not scan %s by received_at:\n%s", index, plan)
		}
	case "sqlite":
		var plan []struct {
			ID     int    `db:"id"`
			Parent int    `db:"parent"`
			NotUse int    `db:"notused"`
			Detail string `db:"detail"`
		}
		if err := e.db.Select(&plan, "EXPLAIN QUERY PLAN "+q, args...); err != nil {
			t.Fatal(err)
		}
		var details []string
		for _, p := range plan {
			details = append(details, p.Detail)
		}
		want := "SEARCH " + e.store.InboxTable()
		d := strings.Join(details, "\n")
		if !strings.Contains(d, "USING INDEX "+index+" (status=? AND received_at<?)") {
			t.Errorf("EXPLAIN QUERY PLAN of a cleanup batch does not search %s by (status, received_at):\n%s (want %s …)", index, d, want)
		}
	}
}

// An inbox table whose primary key was changed, as partitioning it by
// time requires on MySQL (and PostgreSQL), no longer de-duplicates: on
// MySQL the same message is applied twice; on PostgreSQL every Handle
// fails (ON CONFLICT finds no unique index on the key). Cleanup refuses
// to run on it, with an error that names the fix. (SQLite has no
// partitioning, and its primary key cannot be altered.)
func TestCleanupRefusesAPartitionedInbox(t *testing.T) {
	for _, name := range []string{"mysql", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, name, inbox.Config{})
			ctx := context.Background()
			if n, err := e.ib.Cleanup(ctx); err != nil || n != 0 {
				t.Fatalf("Cleanup of the migrated table: %d, %v", n, err)
			}
			table := e.store.InboxTable()
			if name == "mysql" {
				e.db.MustExec("ALTER TABLE " + table + " DROP PRIMARY KEY, ADD PRIMARY KEY (consumer, message_id, received_at)" +
					" PARTITION BY RANGE COLUMNS(received_at) (PARTITION p2000 VALUES LESS THAN ('2000-01-01'), PARTITION pmax VALUES LESS THAN (MAXVALUE))")
			} else {
				var pk string
				if err := e.db.Get(&pk, "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'", table); err != nil {
					t.Fatal(err)
				}
				e.db.MustExec("ALTER TABLE " + table + ` DROP CONSTRAINT "` + pk + `", ADD PRIMARY KEY (consumer, message_id, received_at)`)
			}
			calls := 0
			for range 2 {
				res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: "twice"}, func(context.Context, inbox.Message) error { calls++; return nil })
				if name == "mysql" {
					mustResult(t, res, err, inbox.Applied)
				} else if res != inbox.Failed || err == nil || !strings.Contains(err.Error(), "ON CONFLICT") {
					t.Fatalf("Handle on a re-keyed table: %v, %v; want Failed with PostgreSQL's ON CONFLICT error", res, err)
				}
			}
			want := map[string]int{"mysql": 2, "postgres": 0}[name]
			if rows := e.count(t, "SELECT COUNT(*) FROM "+table+" WHERE message_id = 'twice'"); calls != want || rows != want {
				t.Fatalf("re-keyed table: %d handler calls, %d inbox rows; want %d, %d", calls, rows, want, want)
			}
			_, err := e.ib.Cleanup(ctx)
			if err == nil || !strings.Contains(err.Error(), "(consumer, message_id, received_at), not (consumer, message_id)") ||
				!strings.Contains(err.Error(), "ADD PRIMARY KEY (consumer, message_id)") {
				t.Fatalf("Cleanup on a re-keyed inbox table: %v; want the refusal naming the fix", err)
			}
		})
	}
}
