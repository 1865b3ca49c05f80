// Package natsoutbox delivers the outbox's events to NATS JetStream: it is
// a batch subscription handler that publishes each event as one message,
// with the event id as Nats-Msg-Id so that JetStream stores a redelivered
// event once.
//
//	nc, _ := nats.Connect(url, nats.MaxReconnects(-1))
//	js, _ := jetstream.New(nc)
//	pub, _ := natsoutbox.New(js, natsoutbox.Config{Subject: "events.{type}"})
//	sub := outbox.Subscription{Name: "to-nats", Batch: pub.Handler()}
//	err = pub.Check(ctx, sub, ob.Config()) // the stream's duplicate window
//	err = ob.Subscribe(sub)
//	...
//	ob.Start(ctx)
//	defer nc.Drain()      // runs second: the connection goes after
//	defer ob.Close(ctx)   // the outbox, which may still be publishing
//
// # Subjects
//
// The subject comes from a template (Config.Subject) with the
// placeholders {type}, {aggregate_type}, {aggregate_id} and {tenant},
// validated by New. A '.' in a type or an aggregate type separates tokens,
// so "order.created" under "events.{type}" is "events.order.created";
// every token is sanitised by [Token] (wildcards, whitespace and control
// characters become '_', an empty token "_").
//
// # Messages
//
// The body is the payload, byte for byte. The headers are Nats-Msg-Id
// (the event id) and the metadata every connector sets (txoutbox-id,
// txoutbox-type, ..., content-type, then the event's own headers such as
// traceparent): see the table in adapters/README.md.
//
// # Outcomes
//
// Each event of a batch gets its own outcome (see [Publisher.Handler]): an
// event the server can never take (over max_payload or the stream's
// max_msg_size) is outbox.Permanent, an outage (no connection, no
// responders, timeouts) is outbox.Unavailable and spends no attempts.
//
// # De-duplication
//
// Delivery is at least once: an event is published again when its
// acknowledgement was lost or the process died before the outbox recorded
// it. JetStream drops a message whose Nats-Msg-Id it has seen within the
// stream's duplicate window; [Publisher.Check] (run by
// [Publisher.Subscribe]) warns or refuses when that window is shorter than
// the subscription's [RetrySpan]. Beyond the window, consumers
// de-duplicate on txoutbox-id.
package natsoutbox
