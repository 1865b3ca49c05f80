// Package gormoutbox makes GORM's transactions the outbox's: an event
// published in a GORM transaction is written through that transaction and
// handed to the dispatcher only after it commits, whether the transaction
// was opened by db.Transaction, db.Begin or, per HTTP request, by
// Transactional.
//
// # Setting up
//
// Install the [Plugin] once, right after gorm.Open, and build the outbox
// store over the same *sql.DB (on SQLite: modernc.org/sqlite with
// gorm.io/driver/sqlite's Dialector{Conn: sqlDB}; see the README):
//
//	db, err := gorm.Open(mysql.New(mysql.Config{Conn: sqlDB}), &gorm.Config{})
//	err = db.Use(&gormoutbox.Plugin{})
//	store, err := sqlstore.New(sqlx.NewDb(sqlDB, "mysql"), sqlstore.Options{})
//
// The plugin wraps GORM's connection pool, so that every transaction GORM
// begins is an txctx.Tx with after-commit and after-rollback
// hooks. GORM itself has no after-commit callback.
//
// # Publishing in db.Transaction
//
// [Publish] takes the transaction's *gorm.DB:
//
//	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
//		if err := tx.Create(&order).Error; err != nil {
//			return err
//		}
//		_, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "order.placed", JSON: body})
//		return err
//	})
//
// The outbox is the one in tx's context (outbox.NewContext) or the
// default (outbox.SetDefault). For an explicit outbox use
// ob.PublishTx(ctx, txc, env) with txc from [Wrap]. Code that takes a
// context.Context rather than a *gorm.DB gets one that carries the
// transaction from [Context]: outbox.Publish(gormoutbox.Context(tx), env).
// [AfterCommit] and [AfterRollback] register hooks of one's own.
//
// Outside a transaction Publish returns [ErrNoTx], which matches
// outbox.ErrNoTx, and writes nothing; in a transaction that did not begin
// through the plugin (the plugin is missing, or db.Connection) it returns
// [ErrNotInstalled].
//
// # Savepoints
//
// A db.Transaction inside a transaction is a savepoint. When it rolls back
// (its function returns an error or panics), the events published inside
// it are gone from the table and their hooks are dropped: they are never
// delivered, even though the outer transaction commits. The same holds for
// tx.SavePoint / tx.RollbackTo and for SAVEPOINT, ROLLBACK TO SAVEPOINT
// and RELEASE SAVEPOINT statements run with tx.Exec. After-rollback hooks
// registered inside a rolled-back savepoint run when the transaction
// ends.
//
// # One transaction per HTTP request
//
// [Transactional] is package middleware bound to GORM: each POST, PUT,
// PATCH and DELETE runs in one transaction, the response is buffered, a
// 2xx commits before it goes out and then the after-commit hooks run; any
// other status or a panic rolls back. The transaction begins at its first
// use ([DB], outbox.Publish), not before the handler, so a handler holds
// no pooled connection while it reads a slow client's body; if the pool
// is exhausted then, the request gets 503 (see package middleware, "When
// the transaction begins"). Handlers take the request's
// transaction with [DB] and publish with the request's context:
//
//	r.Use(gormoutbox.Transactional(db, middleware.WithOutbox(ob)))
//	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
//		gormoutbox.DB(r.Context()).Create(&order)
//		outbox.Publish(r.Context(), outbox.Envelope{Type: "order.placed", JSON: body})
//		w.WriteHeader(http.StatusCreated)
//	})
//
// Use DB(ctx), not the root db, inside such a handler: db.Transaction on
// the root db would begin a second transaction on another connection.
// Nested db.Transaction calls on DB(ctx) are savepoints, as above. Do not
// Commit or Rollback the request's transaction yourself.
//
// # PrepareStmt
//
// gorm.Config{PrepareStmt: true} and sessions with PrepareStmt work: the
// plugin sits under GORM's statement cache, which GORM bypasses for its
// own savepoint statements.
//
// # Not supported
//
//   - Transactions begun inside db.Connection, or on a pool that another
//     plugin swaps per statement (gorm.io/plugin/dbresolver): Publish
//     returns ErrNotInstalled.
//   - Sessions made before the plugin was installed keep the old pool.
//   - Savepoint statements sent around GORM (on the *sql.Tx directly) are
//     not seen.
package gormoutbox
