package entoutbox

import (
	"context"
	"database/sql"
	"net/http"
	"reflect"

	"github.com/txoutbox/txoutbox/middleware"
)

// Option configures Transactional: pass the options of package middleware
// (middleware.WithOutbox, WithMethods, WithTimeout, WithIsolation, …)
// directly; this package has no copies of them.
type Option = middleware.Option

// Beginner is the shape of ent's generated *ent.Client: it begins a T.
type Beginner[T any] interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (T, error)
}

// Transactional returns a middleware that runs each POST, PUT, PATCH and
// DELETE request in one ent transaction begun on client, buffers the
// response, commits on a 2xx before the response goes out, and then runs
// the after-commit hooks (see package middleware for the whole contract).
// Handlers get the transaction with Tx[*ent.Tx](r.Context()) and publish
// with outbox.Publish(r.Context(), env). Type inference finds every type
// parameter from client:
//
//	r.Use(entoutbox.Transactional(client, middleware.WithOutbox(ob)))
//
// It panics if client is nil or an option is invalid.
func Transactional[Cl Beginner[T], T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](client Cl, opts ...Option) func(http.Handler) http.Handler {
	return middleware.New(Begin(client), opts...).Handler
}

// Begin returns the middleware.BeginFunc that Transactional uses, for
// building a *middleware.Middleware directly. It panics if client is nil.
func Begin[Cl Beginner[T], T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](client Cl) middleware.BeginFunc {
	if v := reflect.ValueOf(client); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		panic("entoutbox: Begin: client is nil")
	}
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		tx, err := client.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		// No ent hooks: Commit and Rollback of the binding run ours.
		b := newBinding(tx)
		b.ctx = ctx
		return b, nil
	}
}

// The options of package middleware, under this package's name.
