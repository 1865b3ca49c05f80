// Package outbox is the core of txoutbox: a transactional outbox that
// writes events in the caller's database transaction and, once that
// transaction commits, delivers them to subscriptions at least once.
//
// It depends on the standard library and github.com/oklog/ulid/v2 only.
// Storage is behind the [driver.Store] interface (outbox/sqlstore implements it for
// MySQL/MariaDB, PostgreSQL and SQLite); HTTP request transactions come
// from txmw (database/sql, sqlx) or the GORM and ent adapters.
//
// # Publishing
//
// Business code publishes inside a transaction. The transaction is a
// [txctx.Tx]: something to execute the insert through, plus hooks
// that run after commit or after rollback. Middleware puts it in the
// request's context, so handlers write
//
//	outbox.Publish(r.Context(), outbox.Envelope{Type: OrderPlaced, JSON: body})
//
// and code that holds the transaction itself calls [Outbox.PublishTx].
// [Publish] validates the [Envelope] (a type, exactly one payload of at
// most 1 MiB, valid JSON if JSON, token header keys, no CR/LF/NUL in header
// values, headers of at most [MaxHeadersBytes] encoded), gives it a ULID that grows monotonically within the process,
// copies the payload once and inserts the row (status NEW) through the
// transaction. Without a transaction it fails with [ErrNoTx] and writes
// nothing; an invalid envelope fails with a [*ValidationError]. A rolled-back transaction leaves no row and runs no handler.
//
// A unit of work that emits several events publishes them together with
// [PublishAll] (or [Outbox.PublishAllTx]): all are validated first, then
// written in as few multi-row INSERTs as the store allows ([BatchInserter]). Ten events
// in one transaction on MariaDB: 0.78 ms instead of 2.1 ms one by one
// (BenchmarkPublishTen).
//
// # Subscriptions and delivery
//
// Events go to subscriptions: named destinations registered before
// [Outbox.Start] with [Outbox.Handle] (a [Handler] and the event types it
// takes) or [Outbox.Subscribe] (a [Subscription] with its own timeout,
// max attempts, retry policy, classifier, concurrency, batches and
// circuit). The name is what the database records about the subscription,
// so keep it stable across deploys; after Start, Subscribe returns
// [ErrStarted]. Every instance registers its subscriptions in the database
// at start and every PollInterval, and an event is complete only once
// every subscription registered there has it ([Config.SubscriptionExpiry]).
//
// A subscription is owed every event committed after its registration
// committed (at [Outbox.Start]), on whatever instance. Instances other
// than its own know of it only from their next refresh, so the refresh
// is not what keeps the promise: a registration that adds a subscription,
// or widens its types, changes the registry's version
// ([driver.Registration]), and the write that completes an event for a set
// of subscriptions (its DONE, or its split) carries the version that set
// was decided by and changes nothing if it moved on
// ([driver.ErrRegistryChanged]). The instance learns the registry again
// and writes the completion anew with the new version: a split with a
// delivery for each subscription the event owes now (the new one gets it;
// those that had it do not run again), or the same DONE if the new
// subscription does not take its type. The version is
// read by the completing statement, which starts after the event was
// delivered and so after every registration that committed before the
// event: the fence holds for an instance that froze for longer than a
// lease too.
//
// A subscription is owed events until it is retired: by [Outbox.Retire],
// once no instance runs it, or by a running instance after
// [Config.SubscriptionExpiry] in which no instance registered it.
// Retiring settles what it owed ([Retired]): its pending deliveries are
// dropped and counted, and the events that waited only for them become
// DONE. An instance claims only events of the types its subscriptions
// take, and of types that no subscription anywhere takes, which it
// completes at once without a delivery (fenced like any completion).
//
// After a successful commit the event goes to a bounded in-memory hot
// queue; a pool of workers delivers it to each subscription of this
// instance that takes its type. When all succeed the event is marked DONE
// (in batched UPDATEs: the only write of the common case). When some do
// not, one transaction splits the event ([StatusSplit]) and records a
// delivery for each subscription that still owes it ([driver.DeliveryStore]);
// from then on each of them retries, goes dead and is replayed on its own,
// and a subscription that succeeded never runs again for that event. A
// failed attempt is retried after the subscription's back-off (exponential
// with jitter; the instance wakes its poller when the retry falls due, so
// the schedule does not wait for the next poll), and goes DEAD after its
// max attempts, or at once for errors wrapped with [Permanent]. Panics are
// recovered and count as failures; each call is bounded by the
// subscription's timeout. An error text the database could not store
// (invalid UTF-8, NUL) is cleaned before it is written. A subscription's
// failure hooks ([Subscription].OnRetry, OnDead) are called once that
// write has committed, on a goroutine of their own that never holds up
// delivery.
//
// A handler that returns [Unavailable] reports an outage of its
// destination, not a problem of the event: no attempt is counted, and
// after a few in a row the subscription's circuit opens: its events wait
// while one probe at a time tries the destination ([Outbox.CircuitStates],
// [Metrics].Circuit). A probe that fails goes behind the next one, so that
// one event the destination refuses does not keep the circuit open while
// others wait; and an event it keeps refusing right after taking others
// (more than 4 × CircuitThreshold times: the destination is up, the event
// is the problem) spends an attempt on each refusal from then on, and
// goes DEAD after its max attempts like any other failure. A
// [BatchHandler] takes up to BatchSize events per call and may fail some
// of them ([BatchError]). A [TxHandler] writes
// through a transaction on the outbox's own database in which the
// delivery's done mark commits too: its effect happens exactly once.
// [Outbox.Pause] and [Outbox.Resume] act on every instance; [Outbox.Lag]
// tells what each subscription has not delivered yet.
//
// An instance never completes an event for a subscription it does not
// run: an event of a type no subscription here takes is written free for
// any instance and, when it claims one anyway, handed back untouched for
// [Config.NoListenerDelay] (a rolling deploy); an instance with no
// subscription at all claims nothing; a subscription that only
// other instances run gets a delivery of its own when this instance splits
// the event.
//
// # Order
//
// An unordered subscription (the default) has no ordering guarantee, not
// even per aggregate: events are delivered concurrently by several
// workers and instances, a retry comes after later events of the same
// aggregate, and a transaction that commits late is delivered after
// events published after it.
//
// A subscription with Order set to [Ordered] (or [OrderedSkipDead])
// receives the events of one ordering key ([Envelope.Key]: OrderingKey,
// else "AggregateType:AggregateID") one at a time, in the order of the
// key's sequence, on whichever instance delivers them:
//
//   - The sequence is commit order. Publish numbers an ordered event in
//     its key's sequence by updating the key's row in <table>_keys, which
//     stays locked until the transaction ends: two transactions that
//     publish the same key commit one after the other, in sequence order,
//     whatever else they lock. The cost is one more statement per ordered
//     event, and that transactions publishing one key wait for each other
//     from the Publish to the commit. Publish the events of several keys
//     in one transaction with one PublishAll (it locks keys in key order),
//     or in the same key order everywhere: else two transactions can
//     deadlock (the database aborts one of them). On MySQL a key the
//     process has not seen yet gets its row first, outside the
//     transaction, on a connection sqlstore borrows from the pool while
//     new keys come: a new key's row that a rolled-back transaction
//     inserted would leave the key's waiting publishers deadlocked (when
//     the pool has no connection free for it, the transaction inserts
//     the row and the process's other publishers of the key wait for its
//     end in memory). On PostgreSQL an instance that
//     committed one of a key's events less than 5 seconds ago numbers the
//     key's next event itself, after its own last number, without the
//     key's row (one INSERT, as for an unordered event): a unique index
//     on the key's numbers refuses a number another publisher took first,
//     and the event is then numbered from the key's row after the key's
//     highest number. A number is held by its index entry until its
//     transaction ends, so the sequence is still commit order.
//   - One event of a key at a time. An event of a key is leased only once
//     every event before it is delivered, dead, or handed to its
//     subscriptions one by one; a subscription's delivery of it only once
//     that subscription delivered the events before it and no other event
//     of the key is in flight to it. So two instances never deliver two
//     events of one key to one subscription at once. An event whose key's previous event is delivered is leased to
//     the publishing instance and delivered on the hot path as usual (the
//     publishing transaction learns it from the key's row, where the
//     engine records delivered events right after their DONE write: it
//     reads and locks no outbox row). One published while the event
//     before it is in this instance's hands is leased here too and waits
//     in memory behind it: it goes to the hot queue once its predecessor
//     was delivered to every subscription here (before that one's DONE
//     write), and back to the table if its predecessor fails. One that is
//     behind an event held elsewhere waits in the table and is claimed by
//     the instance that finishes the event before it (or by a poll). A
//     claim of a key's head from the table leases with it the events that
//     follow it, whole and free to go, up to about [Config.ColdQueueSize]
//     over the heads claimed together: they wait in memory behind it the
//     same way, so a key's backlog (after a retry, a pause, an outage)
//     costs a claim per run, not one per event. So do an ordered
//     subscription's deliveries of a key's events that the other
//     subscriptions took while it was behind. While a key's head waits
//     for its retry after failing here for every subscription there is
//     (all ordered), the events published behind it are written free and
//     cost no claim until the retry is due.
//   - Head-of-line per key and subscription. A failed event holds back
//     the later events of its key for the subscription it failed for, and
//     nothing else: other keys flow, and the key's later events reach the
//     other subscriptions at once. For the one that failed they wait,
//     attempts unchanged, until it delivered the failed event. With
//     [Ordered] a dead event blocks its key for that subscription until an
//     operator replays it ([Outbox.Replay]) or skips it
//     ([Outbox.SkipDead]); [Outbox.BlockedKeys] lists blocked keys. With
//     [OrderedSkipDead] the key goes on past a dead event. While a
//     subscription is behind on a key, the key's new events go out from
//     the table, not on the hot path.
//
// What is not ordered: events of different keys; events without a key;
// events published by an instance that did not know of the ordered
// subscription (the database records each subscription's Order, and an
// instance learns them at Start and every PollInterval: one that publishes
// without Start orders nothing), such as events published before the
// subscription was first deployed; redeliveries after a
// crash or an expired lease (delivery stays at least once: an event may
// come again, with its id, after later ones, and a crash may repeat
// several events of a key, in order); and under OrderedSkipDead,
// a dead event replayed after the key went on (it comes after the events
// that went on without it, never while one of them is in the handler).
// The guarantee needs a store that implements [driver.OrderedStore]
// (sqlstore on all three databases).
//
// If the hot queue is full, Publish still succeeds: the event stays in the
// table and the poller delivers it. The poller also picks up retries and
// the events of instances that died. It polls every PollInterval, backs off
// while idle, polls again at once while it finds full batches, and never
// uses an id cursor: ids are not in commit order, so a late commit is
// still found. A row the store cannot read (a damaged date, a flag that is
// neither 0 nor 1: [Row.ReadError]) goes DEAD with a reason naming the
// column; it never stops the claim of the others.
//
// # Many instances
//
// Several processes may share one table. Each claims events with a lease
// (owner and expiry, on the database's clock; FOR UPDATE SKIP LOCKED where
// the database has it). The publishing instance holds the lease from the
// insert, and renews the leases of everything it has queued or running
// every Lease/3, so no other instance takes an event it is delivering,
// however slow the handler. Every DONE, RETRY or DEAD write succeeds only
// while the writer still owns the row: a worker whose lease expired and was
// taken over changes nothing. The events of a dead instance are taken over
// when its leases run out ([Config.Lease], 30 s by default).
//
// Delivery is at least once: a handler can see an event again (after a
// crash between the handler and the DONE write, or after a lease expired)
// and must de-duplicate on Event.ID.
//
// # Lifecycle
//
// New builds an Outbox; Start launches its goroutines; Close(ctx) stops the
// poller, lets the workers deliver what is queued until ctx ends, then
// cancels running handlers, hands the rest back to the database, writes
// the last completions, waits for every goroutine, and last releases
// every lease the instance still holds, through the store's
// [driver.OwnerReleaser]: nothing stays leased to a closed instance, even
// when Close cut a hand-back or a DONE short, or a claim answered after
// Close's grace period. Both are safe to call twice; Close works without
// Start. Cancelling Start's context stops the engine without draining: to
// drain on shutdown, give Start a context that outlives the signal
// (context.WithoutCancel) and call Close. An event committed after Close
// began is handed back to the table at once, for another instance; a
// claim already running when Close began finishes, and what it took is
// handed back.
//
// # Retention
//
// Delivered rows stay in the table until deleted. With [Config.Retention]
// set, every instance deletes DONE rows older than it (on the database's
// clock) at Start and every CleanupInterval (DEAD rows too with
// CleanupDead), through the store's [Cleaner]; NEW and RETRY rows are never
// deleted.
//
// # Observability
//
// Logs go to Config.Logger (log/slog) and never contain payloads or header
// values. Measurements go to [Config.Metrics] ([Metrics]); the package
// github.com/txoutbox/txoutbox/prom exports them to Prometheus. Stores may
// implement [StatsReader] (backlog, and rows of a status the engine does
// not know), [DeadLetterStore] (list, replay), [Cleaner] (delete delivered
// rows) and [driver.Inspector] (look one event up).
//
// [Config.Interceptors] see both ends of every event without the core
// knowing what they do: an [Interceptor]'s Publish is called for each
// envelope before it is validated and written, with the publisher's
// context, and may set headers (a trace context); its Deliver wraps each
// handler call (one event for a Handler or Tx, the batch for a Batch) and
// passes a context on to the handler (a span). They apply in order, the
// first outermost. github.com/txoutbox/txoutbox/adapters/otel is the
// OpenTelemetry one: the request's W3C trace context is stored at Publish,
// each delivery is a span linked to it, and connectors copy the headers
// onto the broker's message, so consumers continue the trace.
//
// # Defaults
//
// 4 workers, hot and cold queues of 1000, poll every 5 s (backing off to
// 15 s), batches of 200, skip rows younger than 1 s, lease 30 s, handler
// timeout 10 s, retry 200 ms doubling to 60 s with jitter ×0.5–1.5, 10
// attempts, payloads up to 1 MiB, last_error up to 4000 characters. Status
// codes: 0 NEW, 1 DONE, 2 RETRY, 3 DEAD, 4 SPLIT (delivery state per subscription).
package outbox
