package txmw

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Option configures Transactional: pass the options of package middleware
// (middleware.WithOutbox, WithMethods, WithTimeout, WithIsolation, …)
// directly; this package has no copies of them.
type Option = middleware.Option

// Transactional returns a middleware that runs each POST, PUT, PATCH and
// DELETE request in one transaction on db, commits it on a 2xx response
// before the response goes out, and then runs the after-commit hooks. See
// the package documentation. The transaction begins at its first use, so
// a handler reading a slow client's body holds no connection meanwhile;
// bound clients at the server all the same (http.Server's
// ReadHeaderTimeout and ReadTimeout, http.MaxBytesReader on the body; see
// "Slow clients" in the package documentation). It panics if db is nil or
// an option is invalid.
func Transactional(db *sqlx.DB, opts ...Option) func(http.Handler) http.Handler {
	if db == nil {
		panic("txmw: Transactional: db is nil")
	}
	return middleware.New(Begin(db), opts...).Handler
}

// Begin returns the middleware.BeginFunc that Transactional uses, for
// building a *middleware.Middleware directly.
func Begin(db *sqlx.DB) middleware.BeginFunc {
	if db == nil {
		panic("txmw: Begin: db is nil")
	}
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		tx, err := db.BeginTxx(ctx, opts)
		if err != nil {
			return nil, err
		}
		return &sqlTx{Tx: tx, ctx: ctx}, nil
	}
}

// sqlTx is the request's transaction: the *sqlx.Tx handlers use, and the
// txctx.Tx that outbox.Publish writes through.
type sqlTx struct {
	*sqlx.Tx
	txctx.Hooks
	ctx context.Context // of the begin, for Hooks.End's logger
}

var _ middleware.Unit = (*sqlTx)(nil)

// Commit commits and runs the hooks (txctx.Hooks.End).
func (t *sqlTx) Commit() error { return t.Hooks.End(t.ctx, t.Tx.Commit, true) }

// Rollback rolls back and runs the after-rollback hooks (txctx.Hooks.End).
func (t *sqlTx) Rollback() error { return t.Hooks.End(t.ctx, t.Tx.Rollback, false) }

// TxFrom returns the *sqlx.Tx of the request (or of Transact) that ctx
// belongs to, and reports whether there is one. The request's
// transaction begins here, at its first use (see the package
// documentation); if it cannot begin (the pool is exhausted), TxFrom
// panics with the error, and Transactional answers 503.
func TxFrom(ctx context.Context) (*sqlx.Tx, bool) {
	st, ok := begun(ctx)
	if !ok {
		return nil, false
	}
	return st.Tx, true
}

// begun returns ctx's txmw transaction, begun; it panics with the error
// of a begin that failed, which the middleware answers.
func begun(ctx context.Context) (*sqlTx, bool) {
	t, ok := txctx.From(ctx)
	if !ok {
		return nil, false
	}
	t, err := txctx.Begun(t)
	if err != nil {
		panic(err)
	}
	st, ok := t.(*sqlTx)
	return st, ok
}

// Tx returns the *sqlx.Tx of the request (or of Transact) that ctx belongs
// to. It panics if there is none: a handler that needs a transaction is
// mounted in the wrong place, which no request can repair. Use TxFrom to
// test. The request's transaction begins here at its first use; if it
// cannot begin, Tx panics with the error, which Transactional answers
// with 503.
func Tx(ctx context.Context) *sqlx.Tx {
	if tx, ok := TxFrom(ctx); ok {
		return tx
	}
	if t, ok := txctx.From(ctx); ok {
		t, _ = txctx.Begun(t) // TxFrom began it
		panic(fmt.Sprintf("txmw: Tx: the context carries a %T, not a txmw transaction; use the accessor of the middleware that began it", t))
	}
	panic("txmw: Tx: no transaction in context; wrap the route with txmw.Transactional (it covers POST, PUT, PATCH and DELETE unless WithMethods says otherwise), or use txmw.Transact")
}

// Transact runs fn in a transaction on db, for code outside HTTP handlers
// (jobs, consumers, CLIs). The ctx passed to fn carries the transaction,
// so outbox.Publish(ctx, env) and Tx(ctx) work in it. If fn returns nil,
// Transact commits and then runs the after-commit hooks; if fn returns an
// error or panics, it rolls back, runs the after-rollback hooks and returns
// the error (or lets the panic go on).
//
// If ctx already carries a txmw transaction, fn joins it: Transact begins
// and commits nothing and returns fn's error as is; the outer owner
// decides. So a Transact inside a transactional request holds no second
// connection.
func Transact(ctx context.Context, db *sqlx.DB, fn func(ctx context.Context, tx *sqlx.Tx) error) error {
	if db == nil || fn == nil {
		panic("txmw: Transact needs a db and a function")
	}
	if t, ok := txctx.From(ctx); ok {
		t, err := txctx.Begun(t)
		if err != nil {
			return fmt.Errorf("txmw: Transact: begin the context's transaction: %w", err)
		}
		st, ok := t.(*sqlTx)
		if !ok {
			return fmt.Errorf("txmw: Transact: the context carries a %T, not a txmw transaction, and a second one could deadlock the pool; use the API of the library that began it", t)
		}
		return fn(ctx, st.Tx)
	}
	stx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("txmw: begin transaction: %w", err)
	}
	tx := &sqlTx{Tx: stx, ctx: ctx}
	done := false
	defer func() {
		if !done {
			_ = tx.Rollback() // fn panicked
		}
	}()
	err = fn(txctx.With(ctx, tx), stx)
	done = true
	if err != nil {
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
			err = errors.Join(err, fmt.Errorf("txmw: roll back: %w", rerr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("txmw: commit transaction: %w", err)
	}
	return nil
}

// The options of package middleware, under this package's name.
