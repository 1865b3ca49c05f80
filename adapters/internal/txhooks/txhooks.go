// Package txhooks follows the savepoints of a transaction for the ORM
// adapters: it recognises savepoint statements in the SQL that goes
// through the transaction and reports them to the transaction's
// outbox.Hooks, which drops the after-commit hooks of rolled-back
// savepoints (see outbox.Hooks for the rules).
//
// An ORM that nests transactions as savepoints (GORM's db.Transaction
// inside a transaction, entoutbox.Savepoint) would otherwise deliver an
// event published inside a savepoint that was later rolled back: its row
// is gone, but its hook would still run at the outer commit.
package txhooks

import (
	"strings"

	"github.com/txoutbox/txoutbox/outbox"
)

// Hooks is the transaction's hook list; it is outbox.Hooks.
type Hooks = outbox.Hooks

// Observe applies query to h's savepoint stack if it is a savepoint
// statement (see Parse) and reports whether it was one. Call it after the
// statement succeeded.
func Observe(h *outbox.Hooks, query string) bool {
	op, name, ok := Parse(query)
	if !ok {
		return false
	}
	switch op {
	case OpSavepoint:
		h.Savepoint(name)
	case OpRollbackTo:
		h.RollbackToSavepoint(name)
	case OpRelease:
		h.ReleaseSavepoint(name)
	}
	return true
}

// Op is a savepoint statement.
type Op int

// The savepoint statements Parse recognises.
const (
	OpSavepoint  Op = iota + 1 // SAVEPOINT s
	OpRollbackTo               // ROLLBACK [WORK] TO [SAVEPOINT] s
	OpRelease                  // RELEASE [SAVEPOINT] s
)

// Parse recognises the savepoint statements of MySQL/MariaDB, PostgreSQL
// and SQLite, case-insensitively, with an optional trailing semicolon and
// a quoted or bare name (bare names are lower-cased, as the databases
// compare them case-insensitively). It is cheap for every other statement: it looks
// at the first letter before doing anything else.
func Parse(query string) (op Op, name string, ok bool) {
	q := strings.TrimSpace(query)
	if q == "" || len(q) > 200 {
		return 0, "", false
	}
	switch q[0] {
	case 'S', 's', 'R', 'r':
	default:
		return 0, "", false
	}
	f := strings.Fields(strings.TrimSuffix(q, ";"))
	if len(f) < 2 {
		return 0, "", false
	}
	for i := range f {
		if i < len(f)-1 {
			f[i] = strings.ToUpper(f[i])
		}
	}
	switch {
	case f[0] == "SAVEPOINT" && len(f) == 2:
		op = OpSavepoint
	case f[0] == "ROLLBACK":
		rest := f[1:]
		if len(rest) > 0 && (rest[0] == "WORK" || rest[0] == "TRANSACTION") {
			rest = rest[1:]
		}
		if len(rest) < 2 || rest[0] != "TO" {
			return 0, "", false
		}
		rest = rest[1:]
		if len(rest) == 2 && rest[0] == "SAVEPOINT" {
			rest = rest[1:]
		}
		if len(rest) != 1 {
			return 0, "", false
		}
		op = OpRollbackTo
	case f[0] == "RELEASE":
		if !(len(f) == 2 || len(f) == 3 && f[1] == "SAVEPOINT") {
			return 0, "", false
		}
		op = OpRelease
	default:
		return 0, "", false
	}
	name = f[len(f)-1]
	quoted := false
	if len(name) >= 2 {
		switch q := name[0]; q {
		case '`', '"', '\'':
			if name[len(name)-1] == q {
				name, quoted = name[1:len(name)-1], true
			}
		}
	}
	if !quoted {
		// Bare identifiers are case-insensitive in all three databases.
		name = strings.ToLower(name)
	}
	if name == "" {
		return 0, "", false
	}
	return op, name, true
}
