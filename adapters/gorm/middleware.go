package gormoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Option configures Transactional: pass the options of package middleware
// (middleware.WithOutbox, WithMethods, WithTimeout, WithIsolation, …)
// directly; this package has no copies of them.
type Option = middleware.Option

// Transactional returns a middleware that runs each POST, PUT, PATCH and
// DELETE request in one GORM transaction on db, buffers the response,
// commits on a 2xx before the response goes out, and then runs the
// after-commit hooks (see package middleware for the whole contract).
// Handlers get the transaction with DB(r.Context()) and publish with
// outbox.Publish(r.Context(), env).
//
// It panics if db is nil, is itself a transaction, or does not have the
// plugin installed, or if an option is invalid.
func Transactional(db *gorm.DB, opts ...Option) func(http.Handler) http.Handler {
	if db == nil {
		panic("gormoutbox: Transactional: db is nil")
	}
	return middleware.New(Begin(db), opts...).Handler
}

// Begin returns the middleware.BeginFunc that Transactional uses, for
// building a *middleware.Middleware directly. It panics like
// Transactional.
func Begin(db *gorm.DB) middleware.BeginFunc {
	if db == nil || db.Statement == nil {
		panic("gormoutbox: Begin: db is nil")
	}
	if _, err := conn(db); err == nil || err == ErrNotInstalled {
		panic("gormoutbox: Begin: db is a transaction; pass the *gorm.DB that gorm.Open returned")
	}
	if !installed(db) {
		panic("gormoutbox: the plugin is not installed on db; call db.Use(&gormoutbox.Plugin{}) right after gorm.Open")
	}
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		tx := db.WithContext(ctx).Begin(opts)
		if tx.Error != nil {
			return nil, tx.Error
		}
		c, err := conn(tx)
		if err != nil {
			tx.Rollback()
			return nil, err
		}
		return &boundTx{conn: c, db: tx}, nil
	}
}

// boundTx is a plugin transaction with its *gorm.DB, as the middleware
// and Context put it into a context.
type boundTx struct {
	conn *connTx
	db   *gorm.DB
}

var _ middleware.Unit = (*boundTx)(nil)

func (t *boundTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.conn.ExecContext(ctx, query, args...)
}
func (t *boundTx) AfterCommit(fn func())   { t.conn.AfterCommit(fn) }
func (t *boundTx) AfterRollback(fn func()) { t.conn.AfterRollback(fn) }
func (t *boundTx) Commit() error           { return t.conn.Commit() }
func (t *boundTx) Rollback() error         { return t.conn.Rollback() }

// DBFrom returns the *gorm.DB of the transaction that ctx carries (from
// Transactional or Context), bound to ctx, and reports whether there is
// one. The request's transaction begins here, at its first use (see
// package middleware); if it cannot begin (the pool is exhausted), DBFrom
// panics with the error, and Transactional answers 503.
func DBFrom(ctx context.Context) (*gorm.DB, bool) {
	t, ok := txctx.From(ctx)
	if !ok {
		return nil, false
	}
	t, err := txctx.Begun(t)
	if err != nil {
		panic(err) // the middleware answers 503
	}
	b, ok := t.(*boundTx)
	if !ok {
		return nil, false
	}
	return b.db.WithContext(ctx), true
}

// DB returns the request's transaction as a *gorm.DB bound to ctx:
//
//	gormoutbox.DB(r.Context()).Create(&order)
//
// Nested db.Transaction calls on it use savepoints. Do not Commit or
// Rollback it: the middleware decides by the response status. DB panics
// if ctx carries no GORM transaction: the handler is mounted outside
// Transactional (or its method is not one of WithMethods), which no
// request can repair. Use DBFrom to test.
func DB(ctx context.Context) *gorm.DB {
	if db, ok := DBFrom(ctx); ok {
		return db
	}
	if t, ok := txctx.From(ctx); ok {
		t, _ = txctx.Begun(t) // DBFrom began it
		panic(fmt.Sprintf("gormoutbox: DB: the context carries a %T, not a GORM transaction; use the accessor of the middleware that began it", t))
	}
	panic("gormoutbox: DB: no transaction in context; wrap the route with gormoutbox.Transactional (it covers POST, PUT, PATCH and DELETE unless WithMethods says otherwise)")
}

// The options of package middleware, under this package's name.
