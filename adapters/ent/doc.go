// Package entoutbox makes ent's transactions the outbox's: an event
// published in an ent transaction is written through that transaction and
// handed to the dispatcher only after it commits, whether the transaction
// was opened with client.Tx or, per HTTP request, by Transactional.
//
// The package imports nothing from ent. Its functions are generic over
// the *ent.Tx and *ent.Client that ent generates for your schema, and
// type inference fills in the type parameters: you write Bind(ctx, tx),
// never Bind[...](ctx, tx).
//
// # The sql/execquery feature
//
// entoutbox writes the event row with the transaction's ExecContext,
// which ent generates only with the sql/execquery feature. Generate your
// ent package with it:
//
//	//go:generate go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./schema
//
// (with entc: gen.Config{Features: []gen.Feature{gen.FeatureExecQuery}}).
// Without it, the compiler rejects every call with a message like
//
//	T (type *ent.Tx) does not satisfy entoutbox.GeneratedWithExecQuery[T, CH, C, RH, R] (missing method ExecContext)
//
// and regenerating with the feature is the fix.
//
// # Publishing in a transaction
//
// [Bind] puts the transaction into a context; outbox.Publish writes
// through it, and ent's own OnCommit hook hands the event to the
// dispatcher once tx.Commit succeeds:
//
//	tx, err := client.Tx(ctx)
//	...
//	ctx = entoutbox.Bind(ctx, tx)
//	tx.Order.Create().SetCustomer("ada").SaveX(ctx)
//	_, err = outbox.Publish(ctx, outbox.Envelope{Type: "order.placed", JSON: body})
//	...
//	err = tx.Commit()
//
// The outbox is the one in ctx (outbox.NewContext) or the default
// (outbox.SetDefault). For an explicit outbox, ob.PublishTx(ctx,
// entoutbox.Wrap(tx), env). tx.Rollback, or a failed Commit, drops the
// events and runs the after-rollback hooks. Without a bound transaction,
// outbox.Publish returns outbox.ErrNoTx and writes nothing. [Tx] and
// [TxFrom] return the bound *ent.Tx (tx.Client() gives a client bound to
// it); [outbox.AfterCommit] and [outbox.AfterRollback] register hooks of one's own.
//
// # Savepoints
//
// ent has no nested transactions. [Savepoint] runs a function in a
// SAVEPOINT of the bound transaction and rolls back to it if the function
// fails or panics; the events published inside are then never delivered,
// even though the transaction commits. SAVEPOINT, ROLLBACK TO SAVEPOINT
// and RELEASE SAVEPOINT run by hand are followed too if they go through
// the txctx.Tx (txctx.From(ctx)), but not if they go
// through tx.ExecContext directly.
//
// # One transaction per HTTP request
//
// [Transactional] is package middleware bound to ent: each POST, PUT,
// PATCH and DELETE runs in one transaction, the response is buffered, a
// 2xx commits before it goes out and then the after-commit hooks run; any
// other status or a panic rolls back. The transaction begins at its first
// use ([Tx], outbox.Publish), not before the handler, so a handler holds
// no pooled connection while it reads a slow client's body; if the pool
// is exhausted then, the request gets 503 (see package middleware, "When
// the transaction begins").
//
//	r.Use(entoutbox.Transactional(client, middleware.WithOutbox(ob)))
//	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
//		tx := entoutbox.Tx[*ent.Tx](r.Context())
//		tx.Order.Create().SetCustomer("ada").SaveX(r.Context())
//		outbox.Publish(r.Context(), outbox.Envelope{Type: "order.placed", JSON: body})
//		w.WriteHeader(http.StatusCreated)
//	})
//
// Do not Commit or Rollback the request's transaction yourself, and do
// not begin a second one with the client inside the handler.
//
// # Not supported
//
//   - ent code generated without sql/execquery (it does not compile).
//   - Savepoint statements sent with tx.ExecContext directly.
//   - Hooks registered with tx.OnCommit do not know about savepoints; use
//     outbox.AfterCommit for work that must follow them.
package entoutbox
