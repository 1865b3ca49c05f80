package redisoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults of ConsumerConfig.
const (
	DefaultConcurrency = 4
	DefaultBlock       = time.Second
	DefaultClaimIdle   = time.Minute
)

// ConsumerConfig configures a Consumer. Inbox, Name, Client, Stream,
// Group and Handler are required.
type ConsumerConfig struct {
	// Inbox applies each entry once.
	Inbox *inbox.Inbox
	// Name is the inbox consumer name (the group's, say).
	Name string
	// Client is a *redis.Client, *redis.ClusterClient or *redis.Ring.
	Client redis.UniversalClient
	// Stream and Group: the consumer group is created (with the stream,
	// from its start) if it does not exist.
	Stream, Group string
	// Consumer is this member's name in the group. Defaults to a new
	// unique name at each start: entries a stopped member left pending
	// are claimed by the others (ClaimIdle).
	Consumer string
	// Handler applies an entry; its ctx carries the transaction. The
	// message's payload is the PayloadField field, its headers the other
	// fields.
	Handler inbox.Handler
	// PayloadField is the field that holds the payload. Defaults to
	// DefaultPayloadField.
	PayloadField string
	// Concurrency is the number of entries handled at once. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// Block bounds one XREADGROUP wait, and so how long Close waits for
	// the read in progress. Defaults to DefaultBlock.
	Block time.Duration
	// ClaimIdle is how long an entry stays pending (read, not acked)
	// before a member claims it with XAUTOCLAIM: the entries of a member
	// that died, and entries whose handler failed (Redis has no negative
	// ack; a failed entry is retried after ClaimIdle). It must exceed
	// the longest handler run. Defaults to DefaultClaimIdle.
	ClaimIdle time.Duration
	// Logger gets a line per failed or refused entry, never payloads.
	// Defaults to slog.Default(). Metrics: inbox.Config.Observe.
	Logger *slog.Logger
}

// Consumer reads a stream as a member of a consumer group and applies
// each entry with the inbox, XACKing it only after the database commit:
//
//   - Applied, Duplicate, Parked: XACK;
//   - Failed: left pending, claimed again after ClaimIdle (by this
//     member or another);
//   - Rejected (too large): XACK and an error log line; Redis has no
//     dead-letter stream.
//
// The id is the txoutbox-id field, else inbox.DeriveID("redis", stream,
// entry id): an entry id does not change when the entry is claimed.
// Close stops reading and claiming and lets the entries being handled
// finish; entries read but not started stay pending for the others.
type Consumer struct {
	cfg ConsumerConfig
	log *slog.Logger

	mu      sync.Mutex
	run     bool
	stop    context.CancelFunc // of reading and claiming
	hcancel context.CancelFunc
	wg      sync.WaitGroup // reader and claimer
	workers sync.WaitGroup
	once    sync.Once
}

// NewConsumer checks cfg and returns a Consumer; Start starts it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case cfg.Inbox == nil:
		return nil, errors.New("redisoutbox: ConsumerConfig.Inbox is nil: create one with inbox.New")
	case cfg.Name == "":
		return nil, errors.New("redisoutbox: ConsumerConfig.Name is empty: name the consumer for the inbox's de-duplication")
	case cfg.Client == nil || cfg.Stream == "" || cfg.Group == "":
		return nil, errors.New("redisoutbox: ConsumerConfig.Client, Stream and Group are required")
	case cfg.Handler == nil:
		return nil, errors.New("redisoutbox: ConsumerConfig.Handler is nil")
	case cfg.Concurrency < 0 || cfg.Block < 0 || cfg.ClaimIdle < 0:
		return nil, errors.New("redisoutbox: ConsumerConfig.Concurrency, Block and ClaimIdle must not be negative; 0 means the default")
	}
	cfg.Consumer = cmp.Or(cfg.Consumer, "txoutbox-"+outbox.NewID())
	cfg.PayloadField = cmp.Or(cfg.PayloadField, DefaultPayloadField)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.Block = cmp.Or(cfg.Block, DefaultBlock)
	cfg.ClaimIdle = cmp.Or(cfg.ClaimIdle, DefaultClaimIdle)
	return &Consumer{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default())}, nil
}

// Start creates the group if needed and starts reading, claiming and
// handling; ctx is the parent of the handlers' contexts.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run {
		return nil
	}
	err := c.cfg.Client.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redisoutbox: create group %s on %s: %w", c.cfg.Group, c.cfg.Stream, err)
	}
	c.run = true
	base := context.WithoutCancel(ctx)
	rctx, stop := context.WithCancel(base)
	hctx, hcancel := context.WithCancel(base)
	c.stop, c.hcancel = stop, hcancel
	work := make(chan redis.XMessage)
	c.wg.Add(2)
	go c.read(rctx, work)
	go c.claim(rctx, work)
	c.workers.Add(c.cfg.Concurrency)
	for range c.cfg.Concurrency {
		go c.work(hctx, work)
	}
	go func() { c.wg.Wait(); close(work) }()
	return nil
}

// read reads new entries until ctx ends.
func (c *Consumer) read(ctx context.Context, work chan<- redis.XMessage) {
	defer c.wg.Done()
	for ctx.Err() == nil {
		streams, err := c.cfg.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Consumer, Streams: []string{c.cfg.Stream, ">"},
			Count: int64(c.cfg.Concurrency), Block: c.cfg.Block,
		}).Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
				c.log.Warn("redisoutbox: read", slog.String("consumer", c.cfg.Name), slog.Any("error", err))
				c.pause(ctx, c.cfg.Block)
			}
			continue
		}
		for _, s := range streams {
			if !c.hand(ctx, work, s.Messages) {
				return
			}
		}
	}
}

// claim takes over entries pending longer than ClaimIdle, every
// ClaimIdle/2.
func (c *Consumer) claim(ctx context.Context, work chan<- redis.XMessage) {
	defer c.wg.Done()
	for c.pause(ctx, c.cfg.ClaimIdle/2) {
		start := "0-0"
		for {
			msgs, next, err := c.cfg.Client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
				MinIdle: c.cfg.ClaimIdle, Start: start, Count: int64(c.cfg.Concurrency),
			}).Result()
			if err != nil {
				if ctx.Err() == nil {
					c.log.Warn("redisoutbox: claim", slog.String("consumer", c.cfg.Name), slog.Any("error", err))
				}
				break
			}
			if !c.hand(ctx, work, msgs) {
				return
			}
			if next == "0-0" || len(msgs) == 0 {
				break
			}
			start = next
		}
	}
}

// hand passes msgs to the workers; false once ctx ended (the rest stay
// pending).
func (c *Consumer) hand(ctx context.Context, work chan<- redis.XMessage, msgs []redis.XMessage) bool {
	for _, m := range msgs {
		select {
		case work <- m:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// pause waits d or until ctx ends; it reports whether ctx is still live.
func (c *Consumer) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Consumer) work(ctx context.Context, work <-chan redis.XMessage) {
	defer c.workers.Done()
	for x := range work {
		c.handle(ctx, x)
	}
}

func (c *Consumer) handle(ctx context.Context, x redis.XMessage) {
	m := c.message(x)
	res, err := c.cfg.Inbox.Handle(ctx, c.cfg.Name, m, c.cfg.Handler)
	switch {
	case res.Settled():
	case res == inbox.Rejected:
		c.log.Error("redisoutbox: entry refused and acknowledged", slog.String("consumer", c.cfg.Name), slog.String("entry", x.ID), slog.Any("error", err))
	default:
		c.log.Warn("redisoutbox: handler failed; the entry stays pending and is claimed again after ClaimIdle",
			slog.String("consumer", c.cfg.Name), slog.String("message_id", m.ID), slog.Any("error", err))
		return
	}
	if err := c.cfg.Client.XAck(context.WithoutCancel(ctx), c.cfg.Stream, c.cfg.Group, x.ID).Err(); err != nil {
		// It stays pending and comes again: a duplicate for the inbox.
		c.log.Warn("redisoutbox: ack", slog.String("consumer", c.cfg.Name), slog.String("entry", x.ID), slog.Any("error", err))
	}
}

// message converts x: the payload field is the payload, the other
// fields the headers.
func (c *Consumer) message(x redis.XMessage) inbox.Message {
	m := inbox.Message{Headers: make(map[string]string, len(x.Values))}
	for k, v := range x.Values {
		s := fmt.Sprint(v)
		if k == c.cfg.PayloadField {
			m.Payload = []byte(s)
			continue
		}
		m.Headers[k] = s
	}
	m.ID = m.Headers[meta.ID]
	if m.ID == "" {
		m.ID = inbox.DeriveID("redis", c.cfg.Stream, x.ID)
	}
	return m
}

// Close stops reading and claiming (waiting at most Block for the read in
// progress), then waits for the entries being handled. If ctx ends first,
// the handlers' context is cancelled (their transactions roll back; the
// entries stay pending) and Close returns ctx's error once they have
// returned.
func (c *Consumer) Close(ctx context.Context) error {
	c.mu.Lock()
	run := c.run
	c.mu.Unlock()
	if !run {
		return nil
	}
	var err error
	c.once.Do(func() {
		c.stop()
		done := make(chan struct{})
		go func() { c.workers.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = ctx.Err()
			c.hcancel()
			<-done
		}
		c.hcancel()
	})
	return err
}
