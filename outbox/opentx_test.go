package outbox

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// hookTx is a transaction that only runs its hooks.
type hookTx struct{ Hooks }

func (*hookTx) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, nil }

// valueTx is a transaction that is not a pointer: it cannot be told
// apart from another, and is not remembered.
type valueTx struct{ h *Hooks }

func (valueTx) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, nil }
func (v valueTx) AfterCommit(fn func())                                         { v.h.AfterCommit(fn) }
func (v valueTx) AfterRollback(fn func())                                       { v.h.AfterRollback(fn) }

// The numbers of an open transaction: remembered until it commits or
// rolls back, and for keyLastFor at most; not for a transaction that is
// not a pointer.
func TestOpenNumbers(t *testing.T) {
	var o openNumbers
	now := time.Now()
	for _, commit := range []bool{true, false} {
		tx := &hookTx{}
		o.set(tx, "k", 3, now)
		o.set(tx, "k", 4, now)
		o.set(tx, "j", 1, now)
		if got := o.get(tx, "k", now); got != 4 {
			t.Fatalf("k took %d in the open transaction; want 4", got)
		}
		if got := o.get(&hookTx{}, "k", now); got != 0 {
			t.Fatalf("another transaction sees k's number %d", got)
		}
		if got := o.get(tx, "k", now.Add(keyLastFor)); got != 0 {
			t.Fatalf("a number %v old is still used: %d", keyLastFor, got)
		}
		end := tx.RolledBack
		if commit {
			end = tx.Committed
		}
		if err := end(); err != nil {
			t.Fatal(err)
		}
		if got, left := o.get(tx, "k", now), len(o.m); got != 0 || left != 0 {
			t.Fatalf("after the transaction ended (commit %v): k %d, %d transactions remembered; want 0, 0", commit, got, left)
		}
	}
	v := valueTx{h: &Hooks{}}
	o.set(v, "k", 1, now)
	if got, left := o.get(v, "k", now), len(o.m); got != 0 || left != 0 {
		t.Fatalf("a transaction that is not a pointer was remembered: %d, %d", got, left)
	}
}
