package entoutbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// ErrNotBound is returned by Savepoint when ctx carries a transaction
// that entoutbox did not bind.
var ErrNotBound = errors.New("entoutbox: the context's transaction was not bound by entoutbox; use entoutbox.Bind or entoutbox.Transactional")

// Savepoint runs fn in a savepoint of the transaction that ctx carries:
// if fn returns an error or panics, the savepoint is rolled back, and so
// is everything fn published (its events are never delivered, even if the
// transaction commits); otherwise the savepoint is released. It returns
// fn's error, joined with the rollback's if that failed, and
// outbox.ErrNoTx if ctx carries no transaction.
//
// ent has no nested transactions; this is the way to get one that the
// outbox follows. Savepoint statements run by hand must go through the
// txctx.Tx (txctx.From(ctx)), not tx.ExecContext, or
// events published inside a rolled-back savepoint would still be
// delivered.
func Savepoint(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	t, ok := txctx.From(ctx)
	if !ok {
		return outbox.ErrNoTx
	}
	t, err = txctx.Begun(t)
	if err != nil {
		return err
	}
	b, ok := t.(bound)
	if !ok {
		return ErrNotBound
	}
	name := b.nextSavepoint()
	if _, err := b.ExecContext(ctx, "SAVEPOINT "+name); err != nil {
		return fmt.Errorf("entoutbox: set savepoint: %w", err)
	}
	rollback := func() error {
		if _, err := b.ExecContext(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT "+name); err != nil {
			return fmt.Errorf("entoutbox: roll back to savepoint: %w", err)
		}
		return nil
	}
	panicked := true
	defer func() {
		if panicked {
			_ = rollback()
		}
	}()
	err = fn(ctx)
	panicked = false
	if err != nil {
		return errors.Join(err, rollback())
	}
	if _, err := b.ExecContext(ctx, "RELEASE SAVEPOINT "+name); err != nil {
		return fmt.Errorf("entoutbox: release savepoint: %w", err)
	}
	return nil
}
