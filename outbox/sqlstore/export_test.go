package sqlstore

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// ByIDStatement is one of the engine's writes that name rows by id, with
// arguments for n ids, for the plan test.
type ByIDStatement struct {
	Name, SQL string
	Args      []any
}

// ByIDStatements returns the store's by-id writes for ids.
func ByIDStatements(s *Store, ids []string) []ByIDStatement {
	n := len(ids)
	out := []ByIDStatement{
		{"claim lease", s.leaseSQL(n), s.idArgs(ids, "me", int64(1000))},
		{"mark done", s.markDoneSQL(n, true), append(s.idArgs(ids, "me"), int64(1))},
		{"extend leases", s.extendSQL(n), s.idArgs(ids, int64(1000), "me")},
		{"release", s.releaseSQL(n, false), s.idArgs(ids, "me")},
		{"release later", s.releaseSQL(n, true), s.idArgs(ids, int64(1000), "me")},
		{"replay", s.replaySQL(n), s.idArgs(ids)},
	}
	if s.d.name == "postgres" {
		out = append(out, ByIDStatement{"lease if free (ClaimHeads)", s.leaseFreeSQL(n), s.idArgs(ids, "me", int64(1000))})
	}
	return out
}

// ScheduleStatement is Schedule's UPDATE of id, 1 ms ahead.
func ScheduleStatement(s *Store, id string) ByIDStatement {
	return ByIDStatement{"schedule", s.scheduleSQL(), []any{int64(1000), id}}
}

// SplitStatements splits a migration's SQL as Migrate does.
func SplitStatements(src string) []string { return splitStatements(src) }

// Bounded exposes bounded.
func Bounded(s *Store, ctx context.Context, q string) string { return s.bounded(ctx, q) }

// MakeKey asks the store's key maker for key's row (MySQL).
func MakeKey(ctx context.Context, s *Store, key string) error {
	return s.maker.make(ctx, s, key)
}

// CheckServerVersion is the rule of Store.CheckServer over a version
// string, for the dialect named dialect.
var CheckServerVersion = checkServerVersion

// LockName returns the name of the named lock that prefix
// ("txoutbox_migrate_", "txoutbox_partitions_") takes on s's table.
func LockName(t testing.TB, s *Store, prefix string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	name, err := s.lockName(ctx, conn, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// DueIndex returns the name of the store's (status, available_at) index.
func DueIndex(s *Store) string { return s.name + "_due" }

// planNames numbers the statements ClaimPlans prepares.
var planNames atomic.Int64

// ClaimPlans returns the plan of each of the claim's reads of due rows
// for req, keyed "retry" and "new" (EXPLAIN, or EXPLAIN QUERY PLAN on
// SQLite; each row of it a line of "column=value" pairs), planned as the
// claim plans them: in its transaction (beginClaim, with the dialect's
// planner settings), or as plain reads where the dialect finds first.
func ClaimPlans(t testing.TB, s *Store, req driver.ClaimRequest) map[string]string {
	t.Helper()
	ctx := context.Background()
	cs, targs := s.claimSetFor(req)
	stmts := map[string][]any{
		cs.retry: withArgs(targs, max(1, req.Limit/4)),
		cs.new:   withArgs(targs, req.Limit, int64(0)),
	}
	names := map[string]string{cs.retry: "retry", cs.new: "new"}
	var q sqlx.QueryerContext = s.db
	if !s.d.findFirst {
		tx, err := s.beginClaim(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		q = tx
		if s.d.name == "postgres" {
			// pgx prepares every statement, and from its sixth run
			// PostgreSQL may use the generic plan, made without the
			// arguments: the same reads, planned so.
			if _, err := tx.ExecContext(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
				t.Fatal(err)
			}
			for _, stmt := range []string{cs.retry, cs.new} {
				args := stmts[stmt]
				name := fmt.Sprintf("claim_plan_%s_%d", names[stmt], planNames.Add(1))
				if _, err := tx.ExecContext(ctx, "PREPARE "+name+" AS "+stmt); err != nil {
					t.Fatalf("%s: PREPARE: %v", name, err)
				}
				defer tx.ExecContext(ctx, "DEALLOCATE "+name)
				lits := make([]string, len(args))
				for i, a := range args {
					switch v := a.(type) {
					case []string:
						lits[i] = "ARRAY['" + strings.Join(v, "', '") + "']"
					default:
						lits[i] = fmt.Sprint(v)
					}
				}
				generic := "EXECUTE " + name + "(" + strings.Join(lits, ", ") + ")"
				stmts[generic], names[generic] = nil, names[stmt]+" (generic plan)"
			}
		}
	}
	explain := "EXPLAIN "
	if s.d.name == "sqlite" {
		explain = "EXPLAIN QUERY PLAN "
	}
	out := map[string]string{}
	for stmt, args := range stmts {
		rs, err := q.QueryxContext(ctx, explain+stmt, args...)
		if err != nil {
			t.Fatalf("%s: EXPLAIN: %v", names[stmt], err)
		}
		var lines []string
		for rs.Next() {
			row := map[string]any{}
			if err := rs.MapScan(row); err != nil {
				t.Fatal(err)
			}
			cols := make([]string, 0, len(row))
			for k, v := range row {
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				cols = append(cols, fmt.Sprintf("%s=%v", k, v))
			}
			sort.Strings(cols)
			lines = append(lines, strings.Join(cols, " "))
		}
		if err := rs.Close(); err != nil {
			t.Fatal(err)
		}
		out[names[stmt]] = strings.Join(lines, "\n")
	}
	return out
}

// NextDueSQL is NextDue's query, for the plan test.
func NextDueSQL(s *Store) string { return s.nextDueSQL() }

// ClaimSQL returns the claim's SELECT of due NEW rows and of due retries
// (no type filter), with their arguments, for the plan test.
func ClaimSQL(s *Store, skipRecent int64, limit int) (newSQL string, newArgs []any, retrySQL string, retryArgs []any) {
	return s.q.claim.new, []any{skipRecent, limit}, s.q.claim.retry, []any{limit}
}
