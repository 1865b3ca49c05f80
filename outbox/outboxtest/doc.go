// Package outboxtest helps test code that publishes through an outbox,
// without a database: an in-memory store, a recorder of delivered events,
// a way to deliver everything due now, and a handler that fails on
// demand.
//
// # The in-memory store
//
// [NewStore] returns a [Store] with the semantics of outbox/sqlstore:
// leases and owner checks, the claim order, events split per
// subscription, dead letters and replay, cleanup and stats, and per-key
// ordering (driver.OrderedStore: Subscription.Order, BlockedKeys,
// SkipDead; it numbers an ordered event when it is inserted, where
// sqlstore's publishing transaction locks the key until it commits, so
// the order of two transactions publishing one key at once is their
// insert order here, their commit order there). It runs the
// conformance suite of outbox/storetest, like every store, so it is a
// reference implementation rather than a mock that drifts from the real
// thing. Its clock is time.Now (or [WithClock]), so inside a
// testing/synctest bubble leases, retries and circuits run on the
// bubble's fake time.
//
// Writes go through its transactions: [Store.Begin] returns a [*Tx], an
// [txctx.Tx] whose rows become visible at [Tx.Commit] and vanish
// at [Tx.Rollback], with the after-commit and after-rollback hooks of
// [txctx.Hooks]. A Tx runs no SQL: its ExecContext returns [ErrNoSQL],
// so code under test that writes its business rows with SQL belongs in a
// test against a real database (outbox/sqlstore's SQLite store is the
// cheapest); code that only publishes is tested here.
//
// # Delivering and asserting
//
// A [Recorder] is a handler that keeps what it receives; [Record]
// subscribes one. [Store.Drain] polls the outbox until nothing is due
// and nothing is in flight, so a test publishes, drains and asserts
// without sleeping. [Failing] wraps a handler to fail the next calls
// ([FailingHandler.FailNext]) or to report the destination unavailable
// ([FailingHandler.Unavailable]), for tests of retries, dead letters and
// circuits.
//
//	st := outboxtest.NewStore()
//	ob, _ := outbox.New(st, outbox.Config{})
//	rec := outboxtest.Record(ob, "test", OrderPlaced)
//	ob.Start(ctx)
//	defer ob.Close(ctx)
//
//	tx := st.Begin(ctx)
//	_, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, JSON: body})
//	tx.Commit()
//	st.Drain(ctx, ob)
//	// rec.Events() holds the OrderPlaced event
package outboxtest
