package sqlstore

// ByIDStatement is one of the engine's writes that name rows by id, with
// arguments for n ids, for the plan test.
type ByIDStatement struct {
	Name, SQL string
	Args      []any
}

// ByIDStatements returns the store's by-id writes for ids.
func ByIDStatements(s *Store, ids []string) []ByIDStatement {
	n := len(ids)
	return []ByIDStatement{
		{"claim lease", s.leaseSQL(n), stringArgs(ids, "me", int64(1000))},
		{"mark done", s.markDoneSQL(n), stringArgs(ids, "me")},
		{"extend leases", s.extendSQL(n), stringArgs(ids, int64(1000), "me")},
		{"release", s.releaseSQL(n, false), stringArgs(ids, "me")},
		{"release later", s.releaseSQL(n, true), stringArgs(ids, int64(1000), "me")},
		{"replay", s.replaySQL(n), stringArgs(ids)},
	}
}
