package amqpoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults of ConsumerConfig.
const (
	DefaultConcurrency = 4
	DefaultRetryDelay  = time.Second
)

// ConsumerConfig configures a Consumer. Inbox, Name, Conn, Queue and
// Handler are required.
type ConsumerConfig struct {
	// Inbox applies each message once.
	Inbox *inbox.Inbox
	// Name is the inbox consumer name (the queue's, say).
	Name string
	// Conn is the connection the Consumer opens its channel on.
	Conn *amqp.Connection
	// Queue is the queue to consume, with manual acks.
	Queue string
	// Handler applies a message; its ctx carries the transaction.
	Handler inbox.Handler
	// Concurrency is the number of messages handled at once, and the
	// channel's prefetch count. Defaults to DefaultConcurrency.
	Concurrency int
	// RetryDelay is how long a message whose handler failed is held
	// before it is returned to the queue (Nack with requeue), so that a
	// failing message does not spin. Defaults to DefaultRetryDelay.
	RetryDelay time.Duration
	// Logger gets a line per failed or refused message, never payloads.
	// Defaults to slog.Default(). Metrics: inbox.Config.Observe.
	Logger *slog.Logger
}

// Consumer consumes a queue and applies each message with the inbox,
// acking it only after the database commit:
//
//   - Applied, Duplicate, Parked: Ack;
//   - Failed: after RetryDelay, Nack with requeue (redelivered);
//   - Rejected (no message-id nor txoutbox-id header, too large): Nack
//     without requeue: to the queue's dead-letter exchange if it has one,
//     else dropped; logged either way.
//
// The id is the AMQP message-id property (our Publisher sets it to the
// event id), else the txoutbox-id header. Close cancels the consumer,
// lets the messages being handled finish, and returns the ones received
// but not started to the queue.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger
	tag string

	mu      sync.Mutex
	ch      *amqp.Channel
	hcancel context.CancelFunc
	wg      sync.WaitGroup
	closing chan struct{}
	once    sync.Once
}

// NewConsumer checks cfg and returns a Consumer; Start starts it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case cfg.Inbox == nil:
		return nil, errors.New("amqpoutbox: ConsumerConfig.Inbox is nil: create one with inbox.New")
	case cfg.Name == "":
		return nil, errors.New("amqpoutbox: ConsumerConfig.Name is empty: name the consumer for the inbox's de-duplication")
	case cfg.Conn == nil || cfg.Queue == "":
		return nil, errors.New("amqpoutbox: ConsumerConfig.Conn and Queue are required")
	case cfg.Handler == nil:
		return nil, errors.New("amqpoutbox: ConsumerConfig.Handler is nil")
	case cfg.Concurrency < 0 || cfg.RetryDelay < 0:
		return nil, errors.New("amqpoutbox: ConsumerConfig.Concurrency and RetryDelay must not be negative; 0 means the default")
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	return &Consumer{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), tag: "txoutbox-inbox-" + outbox.NewID(), closing: make(chan struct{})}, nil
}

// Start opens a channel, sets its prefetch and starts consuming; ctx is
// the parent of the handlers' contexts. A second Start does nothing.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		return nil
	}
	ch, err := c.cfg.Conn.Channel()
	if err != nil {
		return fmt.Errorf("amqpoutbox: open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Concurrency, 0, false); err != nil {
		ch.Close()
		return fmt.Errorf("amqpoutbox: set prefetch: %w", err)
	}
	deliveries, err := ch.Consume(c.cfg.Queue, c.tag, false, false, false, false, nil)
	if err != nil {
		ch.Close()
		return fmt.Errorf("amqpoutbox: consume %s: %w", c.cfg.Queue, err)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.ch, c.hcancel = ch, cancel
	c.wg.Add(c.cfg.Concurrency)
	for range c.cfg.Concurrency {
		go c.work(hctx, deliveries)
	}
	return nil
}

func (c *Consumer) work(ctx context.Context, deliveries <-chan amqp.Delivery) {
	defer c.wg.Done()
	for d := range deliveries {
		select {
		case <-c.closing:
			_ = d.Nack(false, true) // received, not started: back to the queue
			continue
		default:
		}
		c.handle(ctx, d)
	}
}

func (c *Consumer) handle(ctx context.Context, d amqp.Delivery) {
	m := message(d)
	res, err := c.cfg.Inbox.Handle(ctx, c.cfg.Name, m, c.cfg.Handler)
	var aerr error
	switch {
	case res.Settled():
		aerr = d.Ack(false)
	case res == inbox.Rejected:
		c.log.Error("amqpoutbox: message refused (Nack without requeue: dead-lettered if the queue has a dead-letter exchange)",
			slog.String("consumer", c.cfg.Name), slog.String("queue", c.cfg.Queue), slog.Any("error", err))
		aerr = d.Nack(false, false)
	default:
		c.log.Warn("amqpoutbox: handler failed; the message goes back to the queue", slog.String("consumer", c.cfg.Name),
			slog.String("message_id", m.ID), slog.Any("error", err))
		t := time.NewTimer(c.cfg.RetryDelay)
		select {
		case <-t.C:
		case <-c.closing:
			t.Stop()
		}
		aerr = d.Nack(false, true)
	}
	if aerr != nil {
		// The channel is gone: the broker requeues the message, and the
		// inbox sees a duplicate if it was applied.
		c.log.Warn("amqpoutbox: ack", slog.String("consumer", c.cfg.Name), slog.String("message_id", m.ID), slog.Any("error", aerr))
	}
}

// message converts d: the id is message-id, else the txoutbox-id header.
func message(d amqp.Delivery) inbox.Message {
	m := inbox.Message{ID: d.MessageId, Payload: d.Body}
	if len(d.Headers) > 0 {
		m.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			switch x := v.(type) {
			case string:
				m.Headers[k] = x
			case []byte:
				m.Headers[k] = string(x)
			default:
				m.Headers[k] = fmt.Sprint(x)
			}
		}
	}
	if m.ID == "" {
		m.ID = m.Headers[meta.ID]
	}
	return m
}

// Close cancels the consumer, waits for the messages being handled (a
// failed one waiting for RetryDelay goes back at once), returns those
// received but not started, and closes the channel. If ctx ends first,
// the handlers' context is cancelled (their transactions roll back and
// the messages are requeued) and Close returns ctx's error once they
// have returned. Close without Start, and a second Close, do nothing
// more.
func (c *Consumer) Close(ctx context.Context) error {
	c.mu.Lock()
	ch, cancel := c.ch, c.hcancel
	c.mu.Unlock()
	if ch == nil {
		return nil
	}
	var err error
	c.once.Do(func() {
		close(c.closing)
		_ = ch.Cancel(c.tag, false) // the deliveries channel closes
		done := make(chan struct{})
		go func() { c.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
			cancel()
			<-done
		}
		cancel()
		if cerr := ch.Close(); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) && err == nil {
			err = fmt.Errorf("amqpoutbox: close channel: %w", cerr)
		}
	})
	return err
}
