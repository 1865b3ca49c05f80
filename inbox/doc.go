// Package inbox is the receiving side of the outbox: a message from a
// broker or a webhook takes effect once, in the receiver's own
// transaction.
//
// Inbox.Handle runs a handler in one database transaction together with
// the insert of (consumer, message id) into <table>_inbox, and commits
// both. A message whose row exists is a Duplicate: the handler is not
// called and nothing is written. The transaction is in the handler's
// context as an outbox transaction, so outbox.Publish(ctx, env) inside the
// handler commits atomically with the handler's writes and the inbox row:
// consume, transform and produce have an exactly-once effect.
//
//	ib, err := inbox.New(db, inbox.Config{Dialect: inbox.Postgres, Table: "outbox_event"})
//	...
//	res, err := ib.Handle(ctx, "billing", inbox.Message{ID: id, Payload: body}, func(ctx context.Context, m inbox.Message) error {
//		tx := inbox.Tx(ctx) // the *sql.Tx
//		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET …"); err != nil {
//			return err
//		}
//		_, err := outbox.Publish(outbox.NewContext(ctx, ob), outbox.Envelope{Type: "invoice.paid", JSON: …})
//		return err
//	})
//	if res.Settled() {
//		msg.Ack() // only after the commit
//	}
//
// A handler error or panic rolls everything back, and the failed attempt
// is counted outside that transaction; after Config.MaxAttempts the
// message is parked with its payload, headers and last error (a dead
// inbox entry: Parked, Replay, Purge). Cleanup deletes the dedupe rows
// older than Config.Retention.
//
// The tables come from sqlstore.Store.Migrate (migration 006). With
// Config.Begin the transaction is txmw's, GORM's or ent's instead of
// database/sql's. The connector modules (adapters/nats, …) build
// consumers on this package that ack the broker only after the commit.
// See docs/inbox.md.
package inbox
