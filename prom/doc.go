// Package prom exports the measurements of an [outbox.Outbox] to
// Prometheus. It is the only package of the module that imports the
// Prometheus client; the engine reports through the small [outbox.Metrics]
// interface, which [Metrics] implements.
//
// # Use
//
//	reg := prometheus.NewRegistry()
//	m, err := prom.New(reg) // registers every txoutbox_* metric on reg
//	...
//	ob, err := outbox.New(store, outbox.Config{Metrics: m})
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// Several outboxes in one process need one [Metrics] each, told apart with
// [WithConstLabels]; registering two with the same labels fails.
//
// # Metrics
//
// All names start with the namespace, "txoutbox" unless [WithNamespace]
// says otherwise. Durations are in seconds.
//
//	txoutbox_events_published_total{event_type}      counter   events written by Publish, once committed
//	txoutbox_hot_enqueued_total                      counter   committed events handed to the hot queue
//	txoutbox_hot_dropped_total                       counter   committed events left to the poller (hot queue full, late commit)
//	txoutbox_cold_enqueued_total                     counter   events the poller queued
//	txoutbox_dispatch_total{path,outcome}            counter   delivery attempts; outcome is done, retry or dead
//	txoutbox_delivery_failures_total{event_type,outcome} counter failed attempts (retry, dead) by event type
//	txoutbox_dispatch_duration_seconds{path,outcome} histogram time the listeners of an attempt took
//	txoutbox_delivery_latency_seconds{path}          histogram commit (hot) or insert (cold) to first listener call
//	txoutbox_queue_depth{queue}                      gauge     events in the hot and cold in-memory queues
//	txoutbox_queue_capacity{queue}                   gauge     sizes of those queues (depth ÷ capacity = how full)
//	txoutbox_pending_events                          gauge     undelivered rows (NEW or RETRY), sampled
//	txoutbox_pending_oldest_age_seconds              gauge     age of the oldest undelivered row, sampled
//	txoutbox_leases_reclaimed_total                  counter   events taken over from an instance whose lease expired
//	txoutbox_cleaned_rows_total                      counter   rows deleted by the retention cleanups (table and archive)
//	txoutbox_no_listener_total{event_type}           counter   events handed back because this instance has no listener for them
//	txoutbox_unknown_status_events                   gauge     rows with a status the engine does not know, sampled
//
// Every path/outcome series of txoutbox_dispatch_total exists from the
// start with the value 0, so an alert on dead letters fires on the first
// one. The histograms' buckets ([DefaultBuckets]) run from 25µs to 5
// minutes; the pending gauges are sampled every outbox.Config.StatsInterval
// and only if the store implements [driver.StatsReader].
//
// The event_type label has one value per event type, for the first
// [DefaultMaxEventTypes] types committed in the process
// ([WithMaxEventTypes]); later types are counted as [OtherEventType], so
// that types made from data cannot grow the series without bound. Keep
// event types a fixed set of constants, not data.
//
// # Queries and alerts
//
// The README next to this file has PromQL examples and suggested alerts
// (backlog age, dead letters, hot-path overflow).
package prom
