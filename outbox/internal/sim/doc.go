// Package sim is a deterministic simulation of the outbox engine: several
// engines (instances) share one in-memory store (outboxtest.Store) inside
// a testing/synctest bubble, so time is fake and a run of many virtual
// minutes takes milliseconds. One seed decides everything the simulation
// chooses: the configuration, the subscriptions, the workload
// (transactions that publish, roll back or commit late), the handlers'
// outcomes, and the faults (crashes, Close at any moment, a frozen
// instance, store errors before and after a write took effect, a slow
// store, a rolling deploy that adds a subscription, pauses, replays,
// destination outages).
//
// While it runs and at its end it checks the engine's promises
// (docs/design/simulation.md states each one precisely):
//
//   - no loss: every committed event reaches every subscription
//     registered before its commit, or is dead for it;
//   - nothing from a rolled-back transaction is delivered;
//   - per key and ordered subscription, first deliveries in key order and
//     never two in flight;
//   - a Tx subscription's effect commits exactly once;
//   - liveness: once faults stop, everything owed is done or dead within
//     a bound that follows from the configuration (Bound);
//   - no row stays leased to an instance that closed;
//   - the queues stay within their bounds.
//
// Go's scheduler is not under the simulation's control: goroutines that
// become runnable at the same virtual instant may run in either order, so
// a seed fixes the workload, the faults and their virtual times exactly,
// and the interleaving almost always. A failing seed replays with
// SIM_SEED=n (make sim SIM_SEED=n), which prints its trace.
package sim
