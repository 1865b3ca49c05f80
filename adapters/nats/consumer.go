package natsoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults of ConsumerConfig.
const (
	DefaultConcurrency = 4
	DefaultRetryDelay  = time.Second
)

// ConsumerConfig configures a Consumer. Inbox, Name, Consumer and Handler
// are required; the zero value of the rest means the defaults.
type ConsumerConfig struct {
	// Inbox applies each message once.
	Inbox *inbox.Inbox
	// Name is the inbox consumer name: messages are de-duplicated per
	// name. Use one name per logical consumer (the durable's name, say).
	Name string
	// Consumer is a JetStream pull consumer with AckPolicy explicit (the
	// default). Its MaxDeliver, if set, must exceed the inbox's
	// MaxAttempts, or the server gives up on a failing message before the
	// inbox parks it.
	Consumer jetstream.Consumer
	// Handler applies a message; its ctx carries the transaction.
	Handler inbox.Handler
	// Concurrency is the number of messages handled at once. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// RetryDelay is how long the server waits before redelivering a
	// message whose handler failed (NakWithDelay). Defaults to
	// DefaultRetryDelay.
	RetryDelay time.Duration
	// InProgressEvery is how often a message still being handled is
	// reported in progress, so that the server does not redeliver it
	// while its handler runs. Defaults to a third of the consumer's
	// AckWait.
	InProgressEvery time.Duration
	// DeriveID: a message without Nats-Msg-Id nor txoutbox-id header gets
	// inbox.DeriveID("nats", stream, stream sequence) as its id; the
	// sequence is the same at every redelivery of the stored message
	// (not for the same payload published twice). Without it such a
	// message is refused with Term.
	DeriveID bool
	// Logger gets a line per failed, parked or refused message, never
	// payloads. Defaults to slog.Default(). Metrics: inbox.Config.Observe.
	Logger *slog.Logger
}

// Consumer pulls messages from a JetStream consumer and applies each with
// the inbox, acking it only after the database commit:
//
//   - Applied, Duplicate, Parked: Ack;
//   - Failed: NakWithDelay(RetryDelay), the server redelivers it;
//   - Rejected (no id, too large): Term, logged.
//
// Close stops pulling, lets the messages being handled finish, and
// Naks those pulled but not started, so that nothing waits for AckWait.
type Consumer struct {
	cfg  ConsumerConfig
	log  *slog.Logger
	mu   sync.Mutex
	it   jetstream.MessagesContext
	stop context.CancelFunc // of the handlers' context
	wg   sync.WaitGroup

	closing chan struct{} // closed by Close: pulled messages go back
	once    sync.Once
}

// NewConsumer checks cfg and returns a Consumer; Start starts it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case cfg.Inbox == nil:
		return nil, errors.New("natsoutbox: ConsumerConfig.Inbox is nil: create one with inbox.New")
	case cfg.Name == "":
		return nil, errors.New("natsoutbox: ConsumerConfig.Name is empty: name the consumer for the inbox's de-duplication")
	case cfg.Consumer == nil:
		return nil, errors.New("natsoutbox: ConsumerConfig.Consumer is nil: pass a pull consumer (js.CreateOrUpdateConsumer)")
	case cfg.Handler == nil:
		return nil, errors.New("natsoutbox: ConsumerConfig.Handler is nil")
	case cfg.Concurrency < 0 || cfg.RetryDelay < 0 || cfg.InProgressEvery < 0:
		return nil, errors.New("natsoutbox: ConsumerConfig.Concurrency, RetryDelay and InProgressEvery must not be negative; 0 means the default")
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	if cfg.InProgressEvery == 0 {
		wait := 30 * time.Second
		if info := cfg.Consumer.CachedInfo(); info != nil && info.Config.AckWait > 0 {
			wait = info.Config.AckWait
		}
		cfg.InProgressEvery = wait / 3
	}
	return &Consumer{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), closing: make(chan struct{})}, nil
}

// pullExpiry bounds each pull request, and so how long the consumer can
// sit without one. nats.go (v1.55) skips the next pull request when the
// message answering the last one arrives before the client has finished
// sending it, and finds out only when two heartbeats (half the expiry
// each) are missed: with the default expiry of 30 s, a message waited
// 30 s under load (one run in about 100 of TestBillsEachOrderOnce beside
// two busy loops, with no pull request on the server). At 5 s an idle
// consumer sends a pull request every 5 s.
const pullExpiry = 5 * time.Second

// Start starts pulling. ctx is the parent of the handlers' contexts.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.it != nil {
		return nil
	}
	it, err := c.cfg.Consumer.Messages(jetstream.PullMaxMessages(c.cfg.Concurrency), jetstream.PullExpiry(pullExpiry))
	if err != nil {
		return fmt.Errorf("natsoutbox: pull messages: %w", err)
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.it, c.stop = it, stop
	work := make(chan jetstream.Msg)
	c.wg.Add(1 + c.cfg.Concurrency)
	go c.pull(it, work)
	for range c.cfg.Concurrency {
		go c.work(hctx, work)
	}
	return nil
}

// pull reads messages and hands them to the workers until the iterator
// is drained; once Close began, it gives them back instead.
func (c *Consumer) pull(it jetstream.MessagesContext, work chan<- jetstream.Msg) {
	defer c.wg.Done()
	defer close(work)
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return
		}
		if err != nil {
			c.log.Warn("natsoutbox: pull", slog.String("consumer", c.cfg.Name), slog.Any("error", err))
			c.pause(time.Second) // a lost connection fails every Next at once
			continue
		}
		select {
		case <-c.closing:
			_ = msg.Nak()
			continue
		default:
		}
		select {
		case work <- msg:
		case <-c.closing:
			_ = msg.Nak()
		}
	}
}

// pause waits d, or until Close begins.
func (c *Consumer) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.closing:
	}
}

func (c *Consumer) work(ctx context.Context, work <-chan jetstream.Msg) {
	defer c.wg.Done()
	for msg := range work {
		c.handle(ctx, msg)
	}
}

func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg) {
	m, err := c.message(msg)
	res := inbox.Rejected
	if err == nil {
		done := c.keepAlive(msg)
		res, err = c.cfg.Inbox.Handle(ctx, c.cfg.Name, m, c.cfg.Handler)
		done()
	}
	var aerr error
	switch {
	case res.Settled():
		aerr = msg.Ack()
	case res == inbox.Rejected:
		c.log.Error("natsoutbox: message refused (Term)", slog.String("consumer", c.cfg.Name), slog.String("subject", msg.Subject()), slog.Any("error", err))
		aerr = msg.Term()
	default:
		c.log.Warn("natsoutbox: handler failed; the server redelivers the message", slog.String("consumer", c.cfg.Name),
			slog.String("message_id", m.ID), slog.Any("error", err))
		aerr = msg.NakWithDelay(c.cfg.RetryDelay)
	}
	if aerr != nil {
		// The server redelivers after AckWait; the inbox sees a duplicate.
		c.log.Warn("natsoutbox: ack", slog.String("consumer", c.cfg.Name), slog.String("message_id", m.ID), slog.Any("error", aerr))
	}
}

// keepAlive reports msg in progress every InProgressEvery until done.
func (c *Consumer) keepAlive(msg jetstream.Msg) (done func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(c.cfg.InProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

// message converts msg; its id is Nats-Msg-Id, else txoutbox-id, else
// (with DeriveID) the stream coordinates.
func (c *Consumer) message(msg jetstream.Msg) (inbox.Message, error) {
	m := inbox.Message{Payload: msg.Data()}
	h := msg.Headers()
	if len(h) > 0 {
		m.Headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				m.Headers[k] = v[0]
			}
		}
	}
	m.ID = cmp.Or(h.Get(jetstream.MsgIDHeader), h.Get(meta.ID))
	if m.ID == "" && c.cfg.DeriveID {
		md, err := msg.Metadata()
		if err != nil {
			return m, fmt.Errorf("natsoutbox: message without id, and no metadata to derive one: %w", err)
		}
		m.ID = inbox.DeriveID("nats", md.Stream, strconv.FormatUint(md.Sequence.Stream, 10))
	}
	if m.ID == "" {
		return m, fmt.Errorf("natsoutbox: message on %s has neither a Nats-Msg-Id nor a %s header (set ConsumerConfig.DeriveID to key it by stream sequence): %w", msg.Subject(), meta.ID, inbox.ErrNoID)
	}
	return m, nil
}

// Close stops pulling and waits for the messages being handled; those
// pulled but not started go back to the server (Nak). If ctx ends first,
// the handlers' context is cancelled (their messages roll back and are
// redelivered; the inbox does not count that as a failure) and Close
// still waits for them, then returns ctx's error. Close without Start,
// and a second Close, do nothing.
func (c *Consumer) Close(ctx context.Context) error {
	c.mu.Lock()
	it, stop := c.it, c.stop
	c.mu.Unlock()
	if it == nil {
		return nil
	}
	c.once.Do(func() { close(c.closing) })
	it.Drain()
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		stop()
		<-done
	}
	stop()
	return err
}
