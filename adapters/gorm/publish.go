package gormoutbox

import (
	"context"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Publish writes env through the transaction tx runs in and, once that
// transaction commits, hands it to the dispatcher. Use it inside
// db.Transaction, between db.Begin() and Commit, or with the request's
// DB(ctx). The outbox is the one outbox.FromContext finds in tx's context
// (outbox.NewContext, or the default set with outbox.SetDefault).
//
// If tx is not in a transaction it returns ErrNoTx (which matches
// outbox.ErrNoTx) and writes nothing. An event published inside a nested
// db.Transaction (a savepoint) that is rolled back is never delivered.
func Publish(tx *gorm.DB, env outbox.Envelope) (string, error) {
	c, err := conn(tx)
	if err != nil {
		return "", err
	}
	ctx := tx.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	ob := outbox.FromContext(ctx)
	if ob == nil {
		return "", outbox.ErrNoOutbox
	}
	return ob.PublishTx(ctx, c, env)
}

// Wrap returns the transaction tx runs in as an txctx.Tx, for
// ob.PublishTx(ctx, txc, env) with an explicit outbox. It fails like
// Publish.
func Wrap(tx *gorm.DB) (txctx.Tx, error) {
	c, err := conn(tx)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Context returns tx's context carrying tx, so that code that takes a
// context.Context works in the transaction: outbox.Publish(ctx, env),
// DB(ctx), AfterCommit via txctx.From. If tx is not in a
// plugin transaction it returns tx's context unchanged, and
// outbox.Publish in it fails with outbox.ErrNoTx.
func Context(tx *gorm.DB) context.Context {
	if tx == nil || tx.Statement == nil {
		return context.Background()
	}
	ctx := tx.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	c, err := conn(tx)
	if err != nil {
		return ctx
	}
	return txctx.With(ctx, &boundTx{conn: c, db: tx})
}

// AfterCommit registers fn to run once the transaction tx runs in has
// committed, after the hooks registered before it; it is dropped if the
// savepoint it was registered in rolls back. fn runs under its own
// recover and should be quick. It fails like Publish.
func AfterCommit(tx *gorm.DB, fn func()) error {
	c, err := conn(tx)
	if err != nil {
		return err
	}
	c.AfterCommit(fn)
	return nil
}

// AfterRollback registers fn to run once the transaction tx runs in has
// rolled back (or failed to commit), or once it ends if the savepoint fn
// was registered in rolls back. It fails like Publish.
func AfterRollback(tx *gorm.DB, fn func()) error {
	c, err := conn(tx)
	if err != nil {
		return err
	}
	c.AfterRollback(fn)
	return nil
}
