// Package redisoutbox delivers txoutbox events to Redis Streams.
//
// A Publisher is a subscription handler: each batch of events is one
// pipeline of XADD commands, one stream entry per event, whose fields are
// the metadata every txoutbox connector carries (txoutbox-id,
// txoutbox-type, …, traceparent; see adapters/README.md) followed by the
// payload, byte for byte:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	pub, err := redisoutbox.New(rdb, redisoutbox.Config{StreamTemplate: "events:${type}"})
//	...
//	ob.Subscribe(outbox.Subscription{Name: "to-redis", Batch: pub.Handler()})
//
// Delivery is at least once. Redis Streams do not de-duplicate: an event
// delivered again (a crash before the outbox recorded it as done, a reply
// lost with the connection) is a second entry with the same txoutbox-id,
// on which consumers de-duplicate — unless Config.IdempotentTTL is set,
// which adds an event to a stream at most once within a ttl.
//
// The outcome of each event is its own: an entry too big for
// MaxMessageBytes is dead at once, an unreachable server does not spend
// attempts (outbox.Unavailable), other errors are retried.
package redisoutbox
