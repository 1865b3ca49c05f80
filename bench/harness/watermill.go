package harness

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

const (
	wmForwarderTopic = "outbox"
	wmTopic          = "orders"
	wmSeqKey         = "order_seq"
)

// Watermill is Watermill's SQL Pub/Sub with its forwarder component: the
// business transaction publishes through a forwarder.Publisher over a
// watermill-sql Publisher bound to the transaction; the forwarder polls
// the table with the database's default schema and offsets adapters and republishes to
// an in-process GoChannel, where the listener is.
type Watermill struct {
	// Tuned polls every 10 ms and reads batches of 1000; otherwise the
	// library defaults apply (1 s poll, batch 100).
	Tuned bool

	env     *Env
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	tables  []string
	fwd     *forwarder.Forwarder
	gc      *gochannel.GoChannel
	wg      sync.WaitGroup
	cancel  context.CancelFunc
	qOrder  string
}

func (s *Watermill) Name() string {
	if s.Tuned {
		return "Watermill forwarder, tuned"
	}
	return "Watermill forwarder, default"
}

// WatermillSettings describes the two Watermill configurations on d.
func WatermillSettings(d *Dialect) string {
	return "watermill-sql " + d.WatermillAdapters + watermillSettings
}

const watermillSettings = ", forwarder.Forwarder to gochannel.GoChannel (default config); default: PollInterval 1s, SubscribeBatchSize 100; tuned: PollInterval 10ms, SubscribeBatchSize 1000"

func (s *Watermill) Delivers() bool { return true }

func (s *Watermill) configure(d *Dialect, prefix string) {
	msgs := func(topic string) string { return d.Quote(prefix + "_wm_" + sanitize(topic)) }
	offs := func(topic string) string { return d.Quote(prefix + "_wmoff_" + sanitize(topic)) }
	batch := 0 // the library's default, 100
	if s.Tuned {
		batch = 1000
	}
	s.schema, s.offsets = d.watermill(msgs, offs, batch)
	s.tables = []string{msgs(wmForwarderTopic), offs(wmForwarderTopic)}
}

func sanitize(topic string) string {
	b := []byte(topic)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

func (s *Watermill) subscriberConfig() wsql.SubscriberConfig {
	cfg := wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    s.schema,
		OffsetsAdapter:   s.offsets,
		InitializeSchema: true,
	}
	if s.Tuned {
		cfg.PollInterval = 10 * time.Millisecond
	}
	return cfg
}

// Setup creates the tables and starts the forwarder and the listener.
func (s *Watermill) Setup(ctx context.Context, env *Env) error {
	if err := s.prepare(ctx, env); err != nil {
		return err
	}
	return s.start(ctx)
}

// prepare creates the tables without starting the forwarder.
func (s *Watermill) prepare(ctx context.Context, env *Env) error {
	s.env = env
	s.qOrder = insertOrderSQL(env.DB, env.Orders)
	s.configure(env.dialect(), env.Prefix)
	sub, err := wsql.NewSubscriber(env.DB.DB, s.subscriberConfig(), watermill.NopLogger{})
	if err != nil {
		return fmt.Errorf("harness: watermill subscriber: %w", err)
	}
	defer sub.Close()
	return sub.SubscribeInitialize(wmForwarderTopic)
}

func (s *Watermill) start(ctx context.Context) error {
	logger := watermill.NopLogger{}
	sub, err := wsql.NewSubscriber(s.env.DB.DB, s.subscriberConfig(), logger)
	if err != nil {
		return fmt.Errorf("harness: watermill subscriber: %w", err)
	}
	s.gc = gochannel.NewGoChannel(gochannel.Config{}, logger)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	out, err := s.gc.Subscribe(runCtx, wmTopic)
	if err != nil {
		return err
	}
	rec := s.env.Rec
	s.wg.Go(func() {
		for msg := range out {
			rec.Delivered(seqOf(msg.Metadata.Get(wmSeqKey)))
			msg.Ack()
		}
	})
	s.fwd, err = forwarder.NewForwarder(sub, s.gc, logger, forwarder.Config{ForwarderTopic: wmForwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("harness: watermill forwarder: %w", err)
	}
	s.wg.Go(func() { _ = s.fwd.Run(runCtx) })
	select {
	case <-s.fwd.Running():
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("harness: watermill forwarder did not start")
	}
}

func wmMessage(seq int64, payload []byte) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(wmSeqKey, strconv.FormatInt(seq, 10))
	return msg
}

func (s *Watermill) Tx(ctx context.Context, seq int64, payload []byte) error {
	tx, err := beginOrder(ctx, s.env.DB, s.qOrder, seq)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	pub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: s.schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	fpub := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic})
	if err := fpub.Publish(wmTopic, wmMessage(seq, payload)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.env.Rec.Committed(seq)
	return nil
}

// prefill publishes events first…first+n−1 outside any business
// transaction, in multi-row INSERTs of batch messages.
func (s *Watermill) prefill(first, n int64, batch int) error {
	pub, err := wsql.NewPublisher(s.env.DB.DB, wsql.PublisherConfig{SchemaAdapter: s.schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	fpub := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic})
	msgs := make([]*message.Message, 0, batch)
	for i := first; i < first+n; i++ {
		msgs = append(msgs, wmMessage(i, Payload(i)))
		if len(msgs) == batch || i == first+n-1 {
			if err := fpub.Publish(wmTopic, msgs...); err != nil {
				return err
			}
			msgs = msgs[:0]
		}
	}
	return nil
}

func (s *Watermill) Teardown(ctx context.Context) error {
	if s.fwd != nil {
		_ = s.fwd.Close()
	}
	if s.gc != nil {
		_ = s.gc.Close()
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	if s.env == nil {
		return nil
	}
	return dropTables(ctx, s.env.DB, s.tables...)
}
