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
		{"claim lease", s.leaseSQL(n), s.idArgs(ids, "me", int64(1000))},
		{"mark done", s.markDoneSQL(n), s.idArgs(ids, "me")},
		{"extend leases", s.extendSQL(n), s.idArgs(ids, int64(1000), "me")},
		{"release", s.releaseSQL(n, false), s.idArgs(ids, "me")},
		{"release later", s.releaseSQL(n, true), s.idArgs(ids, int64(1000), "me")},
		{"replay", s.replaySQL(n), s.idArgs(ids)},
	}
}
