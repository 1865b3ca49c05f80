package entoutbox

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"reflect"
	"time"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
)

// Option configures Transactional. It is middleware.Option, so the options
// of package middleware work here too.
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
//	r.Use(entoutbox.Transactional(client, entoutbox.WithOutbox(ob)))
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
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Tx, error) {
		tx, err := client.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		// No ent hooks: the middleware runs Committed or RolledBack itself.
		return newBinding(tx), nil
	}
}

// The options of package middleware, under this package's name.

// WithOutbox puts ob into every request's context, so that
// outbox.Publish(r.Context(), env) uses it; without it, Publish uses the
// outbox set with outbox.SetDefault. See middleware.WithOutbox.
func WithOutbox(ob *outbox.Outbox) Option { return middleware.WithOutbox(ob) }

// WithIsolation sets the isolation level. See middleware.WithIsolation.
func WithIsolation(level sql.IsolationLevel) Option { return middleware.WithIsolation(level) }

// WithReadOnly makes the transactions read-only. See middleware.WithReadOnly.
func WithReadOnly(readOnly bool) Option { return middleware.WithReadOnly(readOnly) }

// WithMethods sets the methods that get a transaction; defaults to POST,
// PUT, PATCH and DELETE. See middleware.WithMethods.
func WithMethods(methods ...string) Option { return middleware.WithMethods(methods...) }

// WithTimeout bounds each transaction. See middleware.WithTimeout.
func WithTimeout(d time.Duration) Option { return middleware.WithTimeout(d) }

// WithBeginTimeout bounds the wait for a connection; past it the request
// gets a 503. See middleware.WithBeginTimeout.
func WithBeginTimeout(d time.Duration) Option { return middleware.WithBeginTimeout(d) }

// WithCommitPolicy sets which statuses commit. See middleware.WithCommitPolicy.
func WithCommitPolicy(p middleware.CommitPolicy) Option { return middleware.WithCommitPolicy(p) }

// WithStreaming makes matching requests stream instead of buffering. See
// middleware.WithStreaming.
func WithStreaming(match func(r *http.Request) bool) Option {
	return middleware.WithStreaming(match)
}

// WithErrorHandler sets what answers a failed begin or commit. See
// middleware.WithErrorHandler.
func WithErrorHandler(h middleware.ErrorHandler) Option { return middleware.WithErrorHandler(h) }

// WithLogger sets the logger. See middleware.WithLogger.
func WithLogger(l *slog.Logger) Option { return middleware.WithLogger(l) }
