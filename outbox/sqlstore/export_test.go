package sqlstore

import (
	"context"
	"testing"
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
