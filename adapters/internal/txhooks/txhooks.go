// Package txhooks follows the savepoints of a transaction for the ORM
// adapters: it recognises savepoint statements in the SQL that goes
// through the transaction and reports them to the transaction's
// txctx.Hooks, which drops the after-commit hooks of rolled-back
// savepoints (see txctx.Hooks for the rules).
//
// An ORM that nests transactions as savepoints (GORM's db.Transaction
// inside a transaction, entoutbox.Savepoint) would otherwise deliver an
// event published inside a savepoint that was later rolled back: its row
// is gone, but its hook would still run at the outer commit.
package txhooks

import (
	"strings"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Hooks is the transaction's hook list; it is txctx.Hooks.
type Hooks = txctx.Hooks

// Observe applies query to h's savepoint stack if it is a savepoint
// statement (see Parse) and reports whether it was one. Call it after the
// statement succeeded.
func Observe(h *txctx.Hooks, query string) bool {
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
	words, ok := statementWords(query)
	if !ok {
		return 0, "", false
	}
	op, ok = savepointOp(words)
	if !ok {
		return 0, "", false
	}
	name = savepointName(words[len(words)-1])
	if name == "" {
		return 0, "", false
	}
	return op, name, true
}

// statementWords splits a statement that may be a savepoint statement into
// its words, upper-casing every word but the last (the savepoint name). It
// reports false, without splitting, for a statement that cannot be one: empty,
// longer than 200 bytes, not starting with S or R, or of fewer than two words.
func statementWords(query string) ([]string, bool) {
	q := strings.TrimSpace(query)
	if q == "" || len(q) > 200 {
		return nil, false
	}
	switch q[0] {
	case 'S', 's', 'R', 'r':
	default:
		return nil, false
	}
	f := strings.Fields(strings.TrimSuffix(q, ";"))
	if len(f) < 2 {
		return nil, false
	}
	for i := range f[:len(f)-1] {
		f[i] = strings.ToUpper(f[i])
	}
	return f, true
}

// savepointOp reports which savepoint statement words (as statementWords
// returns them) are, and false if they are none: the name must be the last
// word and the only one after the keywords.
func savepointOp(words []string) (Op, bool) {
	switch words[0] {
	case "SAVEPOINT":
		return OpSavepoint, len(words) == 2
	case "ROLLBACK":
		return OpRollbackTo, isRollbackTo(words[1:])
	case "RELEASE":
		return OpRelease, len(words) == 2 || len(words) == 3 && words[1] == "SAVEPOINT"
	}
	return 0, false
}

// isRollbackTo reports whether the words after ROLLBACK are
// "[WORK|TRANSACTION] TO [SAVEPOINT] name".
func isRollbackTo(rest []string) bool {
	if len(rest) > 0 && (rest[0] == "WORK" || rest[0] == "TRANSACTION") {
		rest = rest[1:]
	}
	if len(rest) < 2 || rest[0] != "TO" {
		return false
	}
	rest = rest[1:]
	if len(rest) == 2 && rest[0] == "SAVEPOINT" {
		rest = rest[1:]
	}
	return len(rest) == 1
}

// savepointName returns the savepoint name that word spells: a name quoted
// with backticks, double or single quotes loses its quotes and keeps its
// case; a bare name is lower-cased, as bare identifiers are case-insensitive
// in all three databases. The result is empty for an empty quoted name.
func savepointName(word string) string {
	if len(word) >= 2 {
		switch q := word[0]; q {
		case '`', '"', '\'':
			if word[len(word)-1] == q {
				return word[1 : len(word)-1]
			}
		}
	}
	return strings.ToLower(word)
}
