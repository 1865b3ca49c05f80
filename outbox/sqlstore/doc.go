// Package sqlstore implements driver.Store on SQL databases through sqlx:
// MySQL 8 and MariaDB 10.6+ (the primary target), PostgreSQL 13+, and
// SQLite 3.42+ (embedded, through the pure-Go modernc.org/sqlite).
//
//	db := sqlx.MustOpen("mysql", "app@tcp(db:3306)/app?parseTime=true&interpolateParams=true")
//	store, err := sqlstore.New(db, sqlstore.Options{}) // dialect from the driver name
//	err = store.Migrate(ctx)                            // at start, never in a request transaction
//	ob, err := outbox.New(store, outbox.Config{})
//
// # Dialects
//
// What differs between databases is one Dialect value (MySQL, Postgres,
// SQLite) holding the SQL for the clock, time arithmetic and row locking;
// there are no driver checks elsewhere. Values are always bound, and the
// table name (Options.Table, default "outbox_event") is validated and
// quoted.
//
// # Claims
//
// Claim runs one short transaction: a SELECT of due rows that no live lease
// holds, ordered by due time, FOR UPDATE SKIP LOCKED on MySQL and
// PostgreSQL, then an UPDATE that leases them. On MySQL/MariaDB it runs at
// READ COMMITTED: under the default REPEATABLE READ, the claim's gap locks
// would block concurrent INSERTs of the business transactions. Deadlocks
// (1213) and lock-wait timeouts (1205), PostgreSQL serialisation failures
// and SQLite busy errors are retried. Every write after a claim checks that
// the caller still owns the row.
//
// # MySQL and MariaDB
//
// Use the DSN option interpolateParams=true: server-side prepared
// statements cost a quarter of the throughput. parseTime is not required.
// Times are UTC DATETIME(6) from UTC_TIMESTAMP(6), so leases use the
// database's clock whatever the clients' clocks say.
//
// The table can be partitioned by day (Store.Partition): delivered days
// are then dropped whole (Store.MaintainPartitions, RunPartitionMaintainer,
// outboxctl partitions maintain) instead of deleted row by row; a day is
// dropped only when none of its events is undelivered. The whole
// conformance suite runs on a partitioned table too.
//
// # SQLite
//
// SQLite has one writer at a time and is meant for one process (the demo,
// tests, small services): open it with SQLiteDSN, which sets immediate
// transactions (concurrent writers queue instead of failing with "database
// is locked"), WAL, a busy timeout and foreign keys. Several outbox
// instances in one process are safe.
//
// # Operations
//
// The Store also implements driver.StatsReader, driver.DeadLetterStore
// (ListDead, Replay), driver.Cleaner (Cleanup deletes DONE, and optionally
// DEAD, rows in batches, never undelivered ones), driver.Inspector and
// driver.OwnerReleaser (ReleaseOwner, the last step of Close).
// Migrations live in the migrations package, one folder per dialect;
// Migrate applies them under a database lock and records them in
// <table>_schema.
package sqlstore
