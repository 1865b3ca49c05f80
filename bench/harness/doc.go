// Package harness measures txoutbox against the raw database limit and
// Watermill's SQL forwarder on MariaDB/MySQL and PostgreSQL, for `make
// bench` (the command is bench/cmd/outboxbench).
//
// It lives in the nested module github.com/txoutbox/txoutbox/bench, so
// that Watermill never becomes a dependency of the library.
//
// # Workload
//
// RunCell runs a [System] for a fixed time with N producers, each looping
// BEGIN; INSERT one order; publish one ~200-byte JSON event; COMMIT. A
// [Recorder] keeps, per event, the commit time (taken just before COMMIT
// returns: txoutbox records it in the first after-commit hook) and the
// first delivery time and count at the listener. After the producers stop
// it waits for the last deliveries, then checks every order row in the
// table against the record: an order never delivered is lost, a second
// delivery a duplicate. The process's user+sys CPU during production is
// recorded too (CellResult.CPU).
//
// # Databases
//
// A [Dialect] holds what the harness's own SQL needs per database: DDL,
// the server clock, identifier quoting and Watermill's schema and offsets
// adapters. Queries are written with `?` and rebound by sqlx; a system
// gets the dialect from its [Env] and never branches on a driver name.
// [MariaDB] runs on go-sql-driver/mysql, [PostgreSQL] on pgx's stdlib.
//
// # Systems
//
//   - [Raw]: the same transaction in plain SQL, the database limit: the
//     order alone, with a minimal outbox row (ULID bytes id, type,
//     aggregate id, JSON payload, created-at, one index; the reference of
//     the ratios), or with sqlstore's exact INSERT into its migrated table.
//   - [Watermill]: watermill-sql's publisher bound to the transaction,
//     wrapped by the forwarder component's publisher; the forwarder polls
//     with the database's default schema and offsets adapters and
//     republishes to an in-process GoChannel. Default and tuned (10 ms
//     poll, batch 1000).
//   - [Txoutbox]: a POST handler wrapped in txmw.Transactional, called
//     in-process, that inserts the order with txmw.Tx and publishes with
//     outbox.Publish; hot path on, or poller only.
//   - [HTTP]: real HTTP over loopback, a chi server on 127.0.0.1:0 and a
//     keep-alive client in the same process: txmw.Transactional with
//     outbox.Publish, or a baseline handler that writes the order and a
//     minimal outbox row by hand.
//
// # Backlogs and memory
//
// [DrainTxoutbox] and [DrainWatermill] prefill a table with N due events
// and time how fast the consumer delivers them; with
// DrainOptions.SampleMemory the Go heap and the RSS are sampled every
// 250 ms.
//
// Every run creates its own uniquely named tables in the database it is
// given and drops them at the end, so runs can share a server with other
// tests.
package harness
