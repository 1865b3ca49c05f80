package sqlstore_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The engine's writes that name rows by id must look them up by primary
// key, whatever the optimizer thinks. With 500 ids on a table of 700 rows
// (a fresh table, or one kept small by the cleanup), MariaDB's unhinted
// plan scans the whole primary key ("type index"): at REPEATABLE READ such a statement locks every row and the gap
// at the end, and the application's INSERTs wait for it (issue 9: requests
// stalled up to 20 s under 64 clients).
func TestEngineWritesUsePrimaryKeyRanges(t *testing.T) {
	db := testdb.MySQL(t)
	st := testdb.Store(t, db)
	ctx := context.Background()
	rows := make([]driver.Row, 700)
	for i := range rows {
		rows[i] = driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
	}
	tx, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.InsertBatch(ctx, tx, rows, "", 0); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	// As during a run: the oldest rows delivered, the newest in flight.
	if _, err := db.Exec("UPDATE "+st.Table()+" SET status = 1 WHERE id < ?", rows[200].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("ANALYZE TABLE " + st.Table()); err != nil {
		t.Fatal(err)
	}
	const n = 500
	ids := make([]string, n)
	for i := range ids {
		ids[i] = rows[len(rows)-1-i].ID
	}
	for _, tc := range sqlstore.ByIDStatements(st, ids) {
		rs, err := db.Queryx("EXPLAIN "+tc.SQL, tc.Args...)
		if err != nil {
			t.Fatalf("%s: EXPLAIN: %v", tc.Name, err)
		}
		for rs.Next() {
			plan := map[string]any{}
			if err := rs.MapScan(plan); err != nil {
				t.Fatal(err)
			}
			if strings.HasSuffix(str(plan["table"]), "_registry") {
				continue // the registry fence's one-row read (const on PRIMARY)
			}
			typ, key := str(plan["type"]), str(plan["key"])
			if typ != "range" || key != "PRIMARY" {
				t.Errorf("%s: plan type %q key %q; want a range on PRIMARY (%v)", tc.Name, typ, key, str(plan["table"]))
			}
		}
		rs.Close()
	}
}

func str(v any) string {
	if b, ok := v.([]byte); ok {
		return strings.TrimSpace(string(b))
	}
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// The same writes on PostgreSQL, whose driver (pgx) prepares every
// statement: from the sixth run of one, PostgreSQL may use the generic
// plan, made without the ids. With few rows due, that plan preferred the
// (status, available_at) index and read every due row on each write.
func TestEngineWritesUsePrimaryKeyInGenericPlans(t *testing.T) {
	db := testdb.Postgres(t)
	st := testdb.Store(t, db)
	ctx := context.Background()
	rows := insertFree(t, st, db, 5000)
	// As in a steady run: nearly everything delivered, a few due.
	if _, err := db.Exec("UPDATE "+st.Table()+" SET status = 1 WHERE id < $1", rows[4900].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("ANALYZE " + st.Table()); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = rows[len(rows)-1-i].ID
	}
	for i, tc := range sqlstore.ByIDStatements(st, ids) {
		name := "plan_" + string(rune('a'+i))
		if _, err := conn.ExecContext(ctx, "PREPARE "+name+" AS "+tc.SQL); err != nil {
			t.Fatalf("%s: PREPARE: %v", tc.Name, err)
		}
		lits := make([]string, len(tc.Args))
		for j, a := range tc.Args {
			switch v := a.(type) {
			case string:
				lits[j] = "'" + v + "'"
			case []string:
				lits[j] = "ARRAY['" + strings.Join(v, "', '") + "']"
			default:
				lits[j] = fmt.Sprint(v)
			}
		}
		var plan []string
		rs, err := conn.QueryContext(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(lits, ", ")+")")
		if err != nil {
			t.Fatalf("%s: EXPLAIN: %v", tc.Name, err)
		}
		for rs.Next() {
			var line string
			if err := rs.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		rs.Close()
		text := strings.Join(plan, "\n")
		if !strings.Contains(text, "_pkey") || strings.Contains(text, "_due") {
			t.Errorf("%s: the generic plan does not look rows up by primary key:\n%s", tc.Name, text)
		}
	}
}

// A claim reads the first due rows in due order by the (status,
// available_at) index, and no more than it takes, whatever the table's
// statistics say: a backlog builds up faster than they are gathered
// (issue 34: on PostgreSQL with statistics from before a backlog of
// 200,000 events, each claim sorted every pending row, 155 ms, and a
// drain fell from 43k to 2.2k events/s). With 10,000 events pending and
// the statistics never gathered, gathered while the table was empty, or
// gathered with the backlog, EXPLAIN of each of the claim's reads of due
// rows, planned as the claim plans them, names the due index and no sort.
func TestClaimPlanIgnoresStatistics(t *testing.T) {
	for _, name := range testdb.Names {
		for _, stats := range []string{"never gathered", "gathered empty", "fresh"} {
			t.Run(name+"/"+stats, func(t *testing.T) {
				db := testdb.Open(t, name)
				st := testdb.Store(t, db)
				switch name {
				case "postgres":
					for _, tb := range st.Tables() {
						if _, err := db.Exec("ALTER TABLE " + tb + " SET (autovacuum_enabled = false)"); err != nil {
							t.Fatal(err)
						}
					}
				case "mysql":
					if _, err := db.Exec("ALTER TABLE " + st.Table() + " STATS_PERSISTENT = 1 STATS_AUTO_RECALC = 0"); err != nil {
						t.Fatal(err)
					}
				}
				analyze := "ANALYZE "
				if name == "mysql" {
					analyze = "ANALYZE TABLE "
				}
				if stats == "gathered empty" {
					if _, err := db.Exec(analyze + st.Table()); err != nil {
						t.Fatal(err)
					}
				}
				for range 10 {
					insertFree(t, st, db, 1000)
				}
				if stats == "fresh" {
					if _, err := db.Exec(analyze + st.Table()); err != nil {
						t.Fatal(err)
					}
				}
				for _, req := range []driver.ClaimRequest{
					{Owner: "me", Limit: 200, Lease: time.Minute},
					{Owner: "me", Limit: 200, Lease: time.Minute, Types: []string{"T", "U"}},
					{Owner: "me", Limit: 200, Lease: time.Minute, NotTypes: []string{"U"}},
				} {
					for read, plan := range sqlstore.ClaimPlans(t, st, req) {
						if sorts(name, plan) || !strings.Contains(plan, sqlstore.DueIndex(st)) {
							t.Errorf("types %v, not %v: the claim's read of %s rows does not take them in order from %s:\n%s",
								req.Types, req.NotTypes, read, sqlstore.DueIndex(st), plan)
						}
					}
				}
			})
		}
	}
}

// sorts reports whether an EXPLAIN of dialect name shows a sort.
func sorts(name, plan string) bool {
	switch name {
	case "postgres":
		return strings.Contains(plan, "Sort")
	case "mysql":
		return strings.Contains(plan, "filesort")
	}
	return strings.Contains(plan, "TEMP B-TREE")
}

// Schedule's UPDATE of one row looks it up by primary key in PostgreSQL's
// generic plan, also when the statistics were gathered while every row
// was delivered and many events have been scheduled since: a plan on the
// (status, available_at) index read every scheduled row per call (a
// bench found 2–3 ms per Publish with 20,000 scheduled, growing with
// them).
func TestScheduleUsesPrimaryKeyInGenericPlans(t *testing.T) {
	db := testdb.Postgres(t)
	st := testdb.Store(t, db)
	ctx := context.Background()
	done := make([]driver.Row, 5000)
	for i := range done {
		done[i] = driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
	}
	if err := st.InsertBatch(ctx, db, done, "", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE " + st.Table() + " SET status = 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("ANALYZE " + st.Table()); err != nil {
		t.Fatal(err)
	}
	rows := insertFree(t, st, db, 20000)
	if _, err := db.Exec("UPDATE " + st.Table() + " SET available_at = available_at + interval '1 hour' WHERE status = 0"); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	tc := sqlstore.ScheduleStatement(st, rows[0].ID)
	if _, err := conn.ExecContext(ctx, "PREPARE sched AS "+tc.SQL); err != nil {
		t.Fatalf("PREPARE: %v", err)
	}
	var plan []string
	rs, err := conn.QueryContext(ctx, fmt.Sprintf("EXPLAIN EXECUTE sched(%d, '%s')", tc.Args[0], tc.Args[1]))
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var line string
		if err := rs.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	rs.Close()
	if text := strings.Join(plan, "\n"); !strings.Contains(text, "_pkey") || strings.Contains(text, "_due") {
		t.Errorf("the generic plan of Schedule does not look the row up by primary key:\n%s", text)
	}
}

// The reads of due rows bound the (status, available_at) index by now:
// the claim's reads of due NEW rows and retries up to now, NextDue from
// now on. On PostgreSQL a bare clock_timestamp() (volatile) was only a
// filter: a claim that found fewer rows due than its limit read every
// scheduled event after them, and NextDue every due or delivered entry
// before now. With 1,000,000 scheduled, a claim took about 65 ms at
// 200,000 still ahead, and delayed events came 1.35 s late at p99.
func TestDueReadsBoundTheIndexByNow(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			st := testdb.Store(t, db)
			ctx := context.Background()
			rows := insertFree(t, st, db, 3000)
			tx, err := db.Beginx()
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rows[5:] {
				if err := st.Schedule(ctx, tx, r.ID, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			bounded := func(plan, op string) bool {
				switch name {
				case "postgres":
					for _, l := range strings.Split(plan, "\n") {
						if strings.Contains(l, "Index Cond:") && strings.Contains(l, "(available_at "+op) {
							return true
						}
					}
					return false
				case "mysql":
					return strings.Contains(plan, "type=range")
				default:
					return strings.Contains(plan, "available_at"+op+"?")
				}
			}
			newSQL, newArgs, retrySQL, retryArgs := sqlstore.ClaimSQL(st, 0, 200)
			for _, c := range []struct {
				what, sql, op string
				args          []any
			}{
				{"NextDue", sqlstore.NextDueSQL(st), ">", nil},
				{"the claim of NEW rows", newSQL, "<", newArgs},
				{"the claim of retries", retrySQL, "<", retryArgs},
			} {
				if plan := explain(t, db, c.sql, c.args...); !bounded(plan, c.op) {
					t.Errorf("%s: the plan does not bound the index by now:\n%s", c.what, plan)
				}
			}
			if wait, any, err := st.NextDue(ctx); err != nil || !any || wait < 59*time.Minute {
				t.Errorf("NextDue = %v, %v, %v; want about an hour", wait, any, err)
			}
			got, err := st.Claim(ctx, driver.ClaimRequest{Owner: "a", Limit: 200, Lease: time.Minute, SkipRecent: -1})
			if err != nil || len(got) != 5 {
				t.Errorf("Claim = %d rows, %v; want the 5 due", len(got), err)
			}
		})
	}
}

// explain returns the plan of q as text: PostgreSQL's EXPLAIN lines,
// MySQL's EXPLAIN rows as key=value, SQLite's EXPLAIN QUERY PLAN details.
func explain(t *testing.T, db *sqlx.DB, q string, args ...any) string {
	t.Helper()
	prefix := "EXPLAIN "
	if strings.Contains(db.DriverName(), "sqlite") {
		prefix = "EXPLAIN QUERY PLAN "
	}
	rs, err := db.Queryx(prefix+q, args...)
	if err != nil {
		t.Fatalf("%s%s: %v", prefix, q, err)
	}
	defer rs.Close()
	var b strings.Builder
	for rs.Next() {
		m := map[string]any{}
		if err := rs.MapScan(m); err != nil {
			t.Fatal(err)
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "%s=%s ", k, strOrNum(m[k]))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func strOrNum(v any) string {
	if s := str(v); s != "" {
		return s
	}
	return fmt.Sprint(v)
}

// insertFree inserts n events of type T, free and due now, and returns
// them.
func insertFree(t *testing.T, st *sqlstore.Store, db *sqlx.DB, n int) []driver.Row {
	t.Helper()
	rows := make([]driver.Row, n)
	for i := range rows {
		rows[i] = driver.Row{ID: outbox.NewID(), Type: "T", Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: time.Now()}
	}
	if err := st.InsertBatch(context.Background(), db, rows, "", 0); err != nil {
		t.Fatal(err)
	}
	return rows
}
