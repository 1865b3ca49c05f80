package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Tx is a database/sql transaction with after-commit and after-rollback
// hooks; it implements txctx.Tx. Use it where no middleware opens the
// transaction for you: background jobs, CLIs, tests.
//
//	tx, err := outbox.BeginTx(ctx, db, nil)
//	...
//	defer tx.Rollback() // no-op after Commit
//	... write business rows with tx.ExecContext ...
//	ob.PublishTx(ctx, tx, env)
//	err = tx.Commit() // on success, the events go to the dispatcher
type Tx struct {
	*sql.Tx
	txctx.Hooks
	ctx context.Context // of BeginTx, for End's logger
}

// BeginTx starts a transaction on db.
func BeginTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*Tx, error) {
	stx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: begin transaction: %w", err)
	}
	return &Tx{Tx: stx, ctx: ctx}, nil
}

// Commit commits the transaction and then runs its hooks (see txctx.Hooks.End).
func (tx *Tx) Commit() error { return tx.End(tx.ctx, tx.Tx.Commit, true) }

// Rollback rolls the transaction back and runs the after-rollback hooks
// (see txctx.Hooks.End). After Commit it does nothing and returns sql.ErrTxDone, so
// it is safe to defer.
func (tx *Tx) Rollback() error { return tx.End(tx.ctx, tx.Tx.Rollback, false) }

// noTxError is the error of a Publish without a transaction in ctx.
func noTxError(ctx context.Context) error {
	if reason := txctx.WhyWithout(ctx); reason != "" {
		return &noTxErr{reason: reason}
	}
	return ErrNoTx
}

// noTxErr is ErrNoTx with the reason middleware gave.
type noTxErr struct{ reason string }

func (e *noTxErr) Error() string        { return "outbox: no transaction in context: " + e.reason }
func (e *noTxErr) Is(target error) bool { return target == ErrNoTx }

// AfterCommit registers fn to run once the transaction that ctx carries
// has committed, after the hooks registered before it; inside a savepoint
// that is rolled back, fn is dropped. It returns ErrNoTx if ctx carries no
// transaction. fn runs under its own recover and should be quick (an HTTP
// response waits for it). It works with every middleware and adapter of
// this module (txmw, gormoutbox, entoutbox, middleware).
func AfterCommit(ctx context.Context, fn func()) error {
	t, ok := txctx.From(ctx)
	if !ok {
		return noTxError(ctx)
	}
	t.AfterCommit(fn)
	return nil
}

// AfterRollback registers fn to run once the transaction that ctx carries
// has rolled back (or failed to commit), or once it ends if the savepoint
// fn was registered in was rolled back. It returns ErrNoTx if ctx carries
// no transaction.
func AfterRollback(ctx context.Context, fn func()) error {
	t, ok := txctx.From(ctx)
	if !ok {
		return noTxError(ctx)
	}
	t.AfterRollback(fn)
	return nil
}
