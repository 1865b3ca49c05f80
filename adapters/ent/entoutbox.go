package entoutbox

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/txoutbox/txoutbox/adapters/internal/txhooks"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// GeneratedWithExecQuery is what entoutbox needs of a transaction: the
// *ent.Tx that ent generates for your schema, built with the sql/execquery
// feature. Its name is what the compiler shows when the feature is
// missing; see "Troubleshooting" in the package's README.
// Type inference fills in all of its type parameters from the *ent.Tx;
// you never write them.
//
// If the compiler reports that your *ent.Tx "does not satisfy
// GeneratedWithExecQuery (missing method ExecContext)", the ent code was generated
// without the sql/execquery feature. Regenerate it with the feature on:
//
//	go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./ent/schema
//
// or, with entc, gen.FeatureExecQuery in gen.Config.Features.
type GeneratedWithExecQuery[T any, CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]] interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	OnCommit(CH)
	OnRollback(RH)
	Commit() error
	Rollback() error
}

// Committer is the shape of ent's generated Committer (ent.Committer)
// for the transaction type T.
type Committer[T any] interface {
	Commit(context.Context, T) error
}

// Rollbacker is the shape of ent's generated Rollbacker (ent.Rollbacker)
// for the transaction type T.
type Rollbacker[T any] interface {
	Rollback(context.Context, T) error
}

// binding is an ent transaction as the outbox sees it.
type binding[T any] struct {
	tx       T
	exec     func(ctx context.Context, query string, args ...any) (sql.Result, error)
	commit   func() error
	rollback func() error
	hooks    txhooks.Hooks
	seq      atomic.Int64    // savepoint names
	ctx      context.Context // of the begin, for Hooks.End's logger; may be nil
}

var _ txctx.Tx = (*binding[*struct{}])(nil)

// ExecContext runs the statement through the ent transaction and follows
// the savepoints it sets, rolls back to and releases.
func (b *binding[T]) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := b.exec(ctx, query, args...)
	if err == nil {
		txhooks.Observe(&b.hooks, query)
	}
	return res, err
}

func (b *binding[T]) AfterCommit(fn func())   { b.hooks.AfterCommit(fn) }
func (b *binding[T]) AfterRollback(fn func()) { b.hooks.AfterRollback(fn) }

// Commit and Rollback make a binding the middleware's Tx: they end the
// transaction and run its hooks (txctx.Hooks.End; the hooks run once, also
// when ent's own commit hook ran them already).
func (b *binding[T]) Commit() error   { return b.hooks.End(b.ctx, b.commit, true) }
func (b *binding[T]) Rollback() error { return b.hooks.End(b.ctx, b.rollback, false) }

func (b *binding[T]) nextSavepoint() string {
	return fmt.Sprintf("entoutbox_sp%d", b.seq.Add(1))
}

func (b *binding[T]) same(tx any) bool { return any(b.tx) == tx }

type bound interface {
	txctx.Tx
	nextSavepoint() string
	same(tx any) bool
}

func newBinding[T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](tx T) *binding[T] {
	return &binding[T]{tx: tx, exec: tx.ExecContext, commit: tx.Commit, rollback: tx.Rollback}
}

// Wrap returns tx as an txctx.Tx, for ob.PublishTx(ctx, txc, env):
// the event row is written with tx.ExecContext, and the after-commit
// hooks run through tx.OnCommit once tx.Commit succeeds (after-rollback
// hooks through tx.OnRollback, or after a failed commit). Each call
// registers one pair of ent hooks; call it once per transaction, or use
// Bind.
//
// It panics if T's commit or rollback hook types are not ent's generated
// ones.
func Wrap[T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](tx T) txctx.Tx {
	return wrap(tx)
}

func wrap[T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](tx T) *binding[T] {
	b := newBinding(tx)
	if _, ok := any(committer[T]{}).(C); !ok {
		panic(fmt.Sprintf("entoutbox: the commit hook type of %T is not ent's generated one", tx))
	}
	if _, ok := any(rollbacker[T]{}).(R); !ok {
		panic(fmt.Sprintf("entoutbox: the rollback hook type of %T is not ent's generated one", tx))
	}
	tx.OnCommit(func(next C) C { return any(committer[T]{next: next, hooks: &b.hooks}).(C) })
	tx.OnRollback(func(next R) R { return any(rollbacker[T]{next: next, hooks: &b.hooks}).(R) })
	return b
}

type committer[T any] struct {
	next  Committer[T]
	hooks *txhooks.Hooks
}

func (c committer[T]) Commit(ctx context.Context, tx T) error {
	return c.hooks.End(ctx, func() error { return c.next.Commit(ctx, tx) }, true)
}

type rollbacker[T any] struct {
	next  Rollbacker[T]
	hooks *txhooks.Hooks
}

func (r rollbacker[T]) Rollback(ctx context.Context, tx T) error {
	return r.hooks.End(ctx, func() error { return r.next.Rollback(ctx, tx) }, false)
}

// Bind returns a copy of ctx that carries tx, so that outbox.Publish(ctx,
// env) writes through tx and delivers after tx.Commit succeeds, and so
// that Tx, AfterCommit and Savepoint work with ctx:
//
//	tx, err := client.Tx(ctx)
//	...
//	ctx = entoutbox.Bind(ctx, tx)
//	tx.Order.Create().SetCustomer("ada").SaveX(ctx)
//	outbox.Publish(ctx, outbox.Envelope{Type: "order.placed", JSON: body})
//	err = tx.Commit() // on success, the event goes to the dispatcher
//
// If ctx already carries tx, Bind returns ctx unchanged. It panics like
// Wrap.
func Bind[T GeneratedWithExecQuery[T, CH, C, RH, R], CH ~func(C) C, C Committer[T], RH ~func(R) R, R Rollbacker[T]](ctx context.Context, tx T) context.Context {
	if t, ok := txctx.From(ctx); ok {
		if _, lazy := t.(txctx.Lazy); lazy {
			t, _ = txctx.Begun(t) // the request's: tx is most likely it
		}
		if b, ok := t.(bound); ok && b.same(tx) {
			return ctx
		}
	}
	return txctx.With(ctx, wrap(tx))
}

// TxFrom returns the ent transaction that ctx carries (from Bind or
// Transactional) and reports whether there is one. The request's
// transaction begins here, at its first use (see package middleware); if
// it cannot begin (the pool is exhausted), TxFrom panics with the error,
// and Transactional answers 503. T is your generated transaction type:
//
//	tx, ok := entoutbox.TxFrom[*ent.Tx](ctx)
func TxFrom[T any](ctx context.Context) (T, bool) {
	var zero T
	t, ok := txctx.From(ctx)
	if !ok {
		return zero, false
	}
	t, err := txctx.Begun(t)
	if err != nil {
		panic(err) // the middleware answers 503
	}
	b, ok := t.(*binding[T])
	if !ok {
		return zero, false
	}
	return b.tx, true
}

// Tx returns the ent transaction of the request (or of Bind) that ctx
// belongs to; use tx.Client() for a client bound to it. It panics if
// there is none: the handler is mounted outside Transactional (or its
// method is not one of WithMethods), which no request can repair. Use
// TxFrom to test.
func Tx[T any](ctx context.Context) T {
	if tx, ok := TxFrom[T](ctx); ok {
		return tx
	}
	if t, ok := txctx.From(ctx); ok {
		t, _ = txctx.Begun(t) // TxFrom began it
		var want T
		panic(fmt.Sprintf("entoutbox: Tx: the context carries a %T, not an ent transaction of type %T; use the accessor of the middleware that began it", t, want))
	}
	panic("entoutbox: Tx: no transaction in context; wrap the route with entoutbox.Transactional (it covers POST, PUT, PATCH and DELETE unless WithMethods says otherwise), or call entoutbox.Bind")
}
