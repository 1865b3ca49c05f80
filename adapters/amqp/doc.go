// Package amqpoutbox delivers outbox events to RabbitMQ (AMQP 0-9-1, with
// github.com/rabbitmq/amqp091-go).
//
// A [Publisher] owns one connection and one channel in confirm mode. Its
// [Publisher.Handler] is an [outbox.BatchHandler]: it publishes a batch,
// then waits for the broker's confirm of every message, and reports an
// outcome per event:
//
//   - confirmed (ack) and routed: delivered;
//
//   - returned as unroutable (published with mandatory set, no queue
//     bound): [outbox.Permanent] by default, see [Config.Unroutable];
//
//   - nacked by the broker: a plain error, retried with back-off;
//
//   - too large ([Config.MaxMessageBytes]), or a routing key the broker
//     cannot take: [outbox.Permanent], at the first attempt;
//
//   - connection or channel lost, broker unreachable, no confirm before
//     the subscription's timeout: [outbox.Unavailable], which costs no
//     attempt and opens the subscription's circuit. The Publisher
//     reconnects on the next call.
//
//     pub, err := amqpoutbox.New(amqpoutbox.Config{URL: "amqp://guest:guest@localhost:5672/", Exchange: "events"})
//     ob.Subscribe(outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()})
//     defer pub.Close()
//
// Messages are persistent; MessageId is the event id, Type the event
// type, Timestamp when it occurred, ContentType and the headers the
// metadata every connector sets (adapters/README.md). RabbitMQ does not
// de-duplicate: delivery is at least once, and consumers de-duplicate on
// the message id (the txoutbox-id header carries the same value).
package amqpoutbox
