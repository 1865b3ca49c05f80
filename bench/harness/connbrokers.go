package harness

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/pkg/amqp"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/outbox"
)

// Broker is one message broker of the connector table: a destination
// (stream, queue, stream key, topic) is prepared empty for each
// measurement, published to three ways, and counted on the broker after.
type Broker interface {
	Name() string
	// Client names the client library and how Raw batches.
	Client() string
	// Prepare creates the destination dest, empty.
	Prepare(ctx context.Context, dest string) error
	// Raw publishes payloads to dest with the broker's own client, in
	// chunks of the connector's batch size: the chunk is sent, then its
	// acks awaited. It calls acked with each chunk's index range once the
	// broker acknowledged it.
	Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error
	// Connector returns the txoutbox connector's batch handler publishing
	// to dest, and a function releasing it.
	Connector(dest string) (outbox.BatchHandler, func(), error)
	// Watermill returns the Watermill publisher of the broker; the topic
	// the forwarder publishes to is WatermillTopic(dest).
	Watermill() (message.Publisher, error)
	WatermillTopic(dest string) string
	// Count returns how many messages dest holds.
	Count(ctx context.Context, dest string) (int64, error)
	// Remove deletes dest.
	Remove(ctx context.Context, dest string)
	Close()
}

// Broker addresses; the defaults are the local services `make test` uses.
type BrokerAddrs struct {
	NATS  string // nats://127.0.0.1:4222
	AMQP  string // amqp://guest:guest@127.0.0.1:5672/
	Redis string // 127.0.0.1:6379
}

func (a BrokerAddrs) withDefaults() BrokerAddrs {
	if a.NATS == "" {
		a.NATS = "nats://127.0.0.1:4222"
	}
	if a.AMQP == "" {
		a.AMQP = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if a.Redis == "" {
		a.Redis = "127.0.0.1:6379"
	}
	return a
}

// OpenBroker connects to the broker called name: nats, amqp, redis or
// kafka (an in-process franz-go kfake cluster).
func OpenBroker(ctx context.Context, name string, a BrokerAddrs) (Broker, error) {
	a = a.withDefaults()
	switch name {
	case "nats":
		nc, err := nats.Connect(a.NATS)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &natsBroker{url: a.NATS, nc: nc, js: js}, nil
	case "amqp":
		conn, err := amqp.Dial(a.AMQP)
		if err != nil {
			return nil, err
		}
		return &amqpBroker{url: a.AMQP, conn: conn}, nil
	case "redis":
		rdb := redis.NewClient(&redis.Options{Addr: a.Redis})
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, err
		}
		return &redisBroker{rdb: rdb, addr: a.Redis}, nil
	case "none":
		return &nopBroker{counts: map[string]*atomic.Int64{}}, nil
	case "kafka":
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, err
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			c.Close()
			return nil, err
		}
		return &kafkaBroker{c: c, cl: cl, adm: kadm.NewClient(cl)}, nil
	}
	return nil, fmt.Errorf("harness: unknown broker %q (nats, amqp, redis, kafka)", name)
}

// BrokerNames are the brokers of the connector table, in its order;
// "none" is no broker at all (a handler and a publisher that only count),
// which shows the ceiling of the database side.
var BrokerNames = []string{"none", "nats", "amqp", "redis", "kafka"}

// --- NATS JetStream

type natsBroker struct {
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
}

func (b *natsBroker) Name() string { return "NATS JetStream" }
func (b *natsBroker) Client() string {
	return "nats.go jetstream: PublishMsgAsync of the chunk, then its acks; file-storage stream"
}

func (b *natsBroker) Prepare(ctx context.Context, dest string) error {
	_ = b.js.DeleteStream(ctx, dest)
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: dest, Subjects: []string{dest, dest + ".>"}})
	return err
}

func (b *natsBroker) Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error {
	futs := make([]jetstream.PubAckFuture, 0, chunk)
	for from := 0; from < len(payloads); from += chunk {
		to := min(from+chunk, len(payloads))
		futs = futs[:0]
		for i := from; i < to; i++ {
			f, err := b.js.PublishMsgAsync(&nats.Msg{Subject: dest + ".OrderPlaced", Data: payloads[i]})
			if err != nil {
				return err
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		acked(from, to)
	}
	return nil
}

func (b *natsBroker) Connector(dest string) (outbox.BatchHandler, func(), error) {
	p, err := natsoutbox.New(b.js, natsoutbox.Config{Subject: dest + ".{type}", Stream: dest})
	if err != nil {
		return nil, nil, err
	}
	return p.Handler(), func() {}, nil
}

func (b *natsBroker) Watermill() (message.Publisher, error) {
	return wnats.NewPublisher(wnats.PublisherConfig{URL: b.url}, watermill.NopLogger{})
}

func (b *natsBroker) WatermillTopic(dest string) string { return dest + ".OrderPlaced" }

func (b *natsBroker) Count(ctx context.Context, dest string) (int64, error) {
	s, err := b.js.Stream(ctx, dest)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.State.Msgs), nil
}

func (b *natsBroker) Remove(ctx context.Context, dest string) { _ = b.js.DeleteStream(ctx, dest) }
func (b *natsBroker) Close()                                  { b.nc.Close() }

// --- RabbitMQ

type amqpBroker struct {
	url  string
	conn *amqp.Connection
}

func (b *amqpBroker) Name() string { return "RabbitMQ" }
func (b *amqpBroker) Client() string {
	return "amqp091-go, confirm mode: persistent PublishWithDeferredConfirm of the chunk, then its confirms; durable classic queue via the default exchange"
}

func (b *amqpBroker) Prepare(ctx context.Context, dest string) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, _ = ch.QueueDelete(dest, false, false, false)
	_, err = ch.QueueDeclare(dest, true, false, false, false, nil)
	return err
}

func (b *amqpBroker) Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error {
	ch, err := b.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	confs := make([]*amqp.DeferredConfirmation, 0, chunk)
	for from := 0; from < len(payloads); from += chunk {
		to := min(from+chunk, len(payloads))
		confs = confs[:0]
		for i := from; i < to; i++ {
			c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", dest, true, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, MessageId: strconv.Itoa(i), Body: payloads[i],
			})
			if err != nil {
				return err
			}
			confs = append(confs, c)
		}
		for _, c := range confs {
			ok, err := c.WaitContext(ctx)
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("harness: amqp: nack")
			}
		}
		acked(from, to)
	}
	return nil
}

func (b *amqpBroker) Connector(dest string) (outbox.BatchHandler, func(), error) {
	p, err := amqpoutbox.New(amqpoutbox.Config{URL: b.url, RoutingKey: dest})
	if err != nil {
		return nil, nil, err
	}
	return p.Handler(), func() { _ = p.Close() }, nil
}

func (b *amqpBroker) Watermill() (message.Publisher, error) {
	return wamqp.NewPublisher(wamqp.NewDurableQueueConfig(b.url), watermill.NopLogger{})
}

func (b *amqpBroker) WatermillTopic(dest string) string { return dest }

func (b *amqpBroker) Count(ctx context.Context, dest string) (int64, error) {
	ch, err := b.conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(dest, true, false, false, false, nil)
	return int64(q.Messages), err
}

func (b *amqpBroker) Remove(ctx context.Context, dest string) {
	if ch, err := b.conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(dest, false, false, false)
		_ = ch.Close()
	}
}

func (b *amqpBroker) Close() { _ = b.conn.Close() }

// --- Redis Streams

type redisBroker struct {
	rdb  *redis.Client
	addr string
}

func (b *redisBroker) Name() string { return "Redis Streams" }
func (b *redisBroker) Client() string {
	return "go-redis v9: one pipeline of XADDs per chunk"
}

func (b *redisBroker) Prepare(ctx context.Context, dest string) error {
	return b.rdb.Del(ctx, dest).Err()
}

func (b *redisBroker) Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error {
	for from := 0; from < len(payloads); from += chunk {
		to := min(from+chunk, len(payloads))
		pipe := b.rdb.Pipeline()
		for i := from; i < to; i++ {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: dest, Values: []any{"id", strconv.Itoa(i), "type", "OrderPlaced", "payload", payloads[i]}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		acked(from, to)
	}
	return nil
}

func (b *redisBroker) Connector(dest string) (outbox.BatchHandler, func(), error) {
	p, err := redisoutbox.New(b.rdb, redisoutbox.Config{Stream: dest})
	if err != nil {
		return nil, nil, err
	}
	return p.Handler(), func() {}, nil
}

func (b *redisBroker) Watermill() (message.Publisher, error) {
	// Its own client: the publisher's Close closes it.
	return redisstream.NewPublisher(redisstream.PublisherConfig{Client: redis.NewClient(&redis.Options{Addr: b.addr})}, watermill.NopLogger{})
}

func (b *redisBroker) WatermillTopic(dest string) string { return dest }

func (b *redisBroker) Count(ctx context.Context, dest string) (int64, error) {
	return b.rdb.XLen(ctx, dest).Result()
}

func (b *redisBroker) Remove(ctx context.Context, dest string) { b.rdb.Del(ctx, dest) }
func (b *redisBroker) Close()                                  { _ = b.rdb.Close() }

// --- Kafka (kfake)

type kafkaBroker struct {
	c   *kfake.Cluster
	cl  *kgo.Client
	adm *kadm.Client
}

func (b *kafkaBroker) Name() string { return "Kafka (kfake, in-process)" }
func (b *kafkaBroker) Client() string {
	return "franz-go kgo (idempotent, acks=all): Produce of the chunk, then its callbacks; one-partition topic on an in-process kfake broker"
}

func (b *kafkaBroker) Prepare(ctx context.Context, dest string) error {
	_, _ = b.adm.DeleteTopics(ctx, dest)
	resp, err := b.adm.CreateTopic(ctx, 1, 1, nil, dest)
	if err != nil {
		return err
	}
	return resp.Err
}

func (b *kafkaBroker) Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error {
	for from := 0; from < len(payloads); from += chunk {
		to := min(from+chunk, len(payloads))
		recs := make([]*kgo.Record, 0, to-from)
		for i := from; i < to; i++ {
			recs = append(recs, &kgo.Record{Topic: dest, Key: []byte(strconv.Itoa(i)), Value: payloads[i]})
		}
		if err := b.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
		acked(from, to)
	}
	return nil
}

func (b *kafkaBroker) Connector(dest string) (outbox.BatchHandler, func(), error) {
	p, err := kafkaoutbox.New(b.cl, kafkaoutbox.Config{Topic: dest})
	if err != nil {
		return nil, nil, err
	}
	return p.Handler(), func() {}, nil
}

func (b *kafkaBroker) Watermill() (message.Publisher, error) {
	return wkafka.NewPublisher(wkafka.PublisherConfig{Brokers: b.c.ListenAddrs(), Marshaler: wkafka.DefaultMarshaler{}}, watermill.NopLogger{})
}

func (b *kafkaBroker) WatermillTopic(dest string) string { return dest }

func (b *kafkaBroker) Count(ctx context.Context, dest string) (int64, error) {
	ends, err := b.adm.ListEndOffsets(ctx, dest)
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, ends.Error()
}

func (b *kafkaBroker) Remove(ctx context.Context, dest string) { _, _ = b.adm.DeleteTopics(ctx, dest) }

func (b *kafkaBroker) Close() {
	b.cl.Close()
	b.c.Close()
}

// brokerTimeout bounds the broker calls of setup and verification.
const brokerTimeout = 30 * time.Second

// --- no broker

type nopBroker struct {
	mu     sync.Mutex
	counts map[string]*atomic.Int64
}

func (b *nopBroker) Name() string { return "none (no-op destination)" }
func (b *nopBroker) Client() string {
	return "none: every publish succeeds at once and is only counted"
}

func (b *nopBroker) count(dest string) *atomic.Int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.counts[dest]
	if !ok {
		c = new(atomic.Int64)
		b.counts[dest] = c
	}
	return c
}

func (b *nopBroker) Prepare(ctx context.Context, dest string) error {
	b.count(dest).Store(0)
	return nil
}

func (b *nopBroker) Raw(ctx context.Context, dest string, payloads [][]byte, chunk int, acked func(from, to int)) error {
	c := b.count(dest)
	for from := 0; from < len(payloads); from += chunk {
		to := min(from+chunk, len(payloads))
		c.Add(int64(to - from))
		acked(from, to)
	}
	return nil
}

func (b *nopBroker) Connector(dest string) (outbox.BatchHandler, func(), error) {
	c := b.count(dest)
	return func(_ context.Context, evs []outbox.Event) error {
		c.Add(int64(len(evs)))
		return nil
	}, func() {}, nil
}

func (b *nopBroker) Watermill() (message.Publisher, error) { return nopPublisher{b}, nil }

func (b *nopBroker) WatermillTopic(dest string) string { return dest }

func (b *nopBroker) Count(ctx context.Context, dest string) (int64, error) {
	return b.count(dest).Load(), nil
}

func (b *nopBroker) Remove(ctx context.Context, dest string) {}
func (b *nopBroker) Close()                                  {}

type nopPublisher struct{ b *nopBroker }

func (p nopPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.b.count(topic).Add(int64(len(msgs)))
	return nil
}

func (p nopPublisher) Close() error { return nil }
