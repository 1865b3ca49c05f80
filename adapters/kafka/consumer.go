package kafkaoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults of ConsumerConfig.
const (
	DefaultConcurrency    = 4
	DefaultMaxPollRecords = 100
)

// DefaultRetryBackoff is the wait before the attempt after attempt n (1
// for the first failure) of a failing record: 100 ms doubling to 5 s.
func DefaultRetryBackoff(n int) time.Duration {
	d := 100 * time.Millisecond << min(max(n-1, 0), 6)
	return min(d, 5*time.Second)
}

// ConsumerConfig configures a Consumer. Inbox, Name, Client and Handler
// are required.
type ConsumerConfig struct {
	// Inbox applies each record once.
	Inbox *inbox.Inbox
	// Name is the inbox consumer name (the group's name, say).
	Name string
	// Client is a consumer group client built with kgo.ConsumerGroup,
	// kgo.ConsumeTopics, kgo.DisableAutoCommit and
	// kgo.BlockRebalanceOnPoll: the Consumer commits offsets itself,
	// after the database commit, and no rebalance moves a partition while
	// its records are being handled. The Consumer does not close it.
	Client *kgo.Client
	// Handler applies a record; its ctx carries the transaction.
	Handler inbox.Handler
	// Concurrency is the number of partitions handled at once; the
	// records of one partition are handled in order. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// MaxPollRecords bounds one poll. Defaults to DefaultMaxPollRecords.
	MaxPollRecords int
	// RetryBackoff is the wait before retrying a record whose handler
	// failed: Kafka has no per-record redelivery, so the Consumer
	// retries in place (the partition waits) until the record is applied
	// or the inbox parks it. Defaults to DefaultRetryBackoff.
	RetryBackoff func(attempt int) time.Duration
	// RequireID refuses (skips, with an error log line) a record without
	// a txoutbox-id header. By default such a record gets
	// inbox.DeriveID("kafka", topic, partition, offset), which a
	// redelivery keeps.
	RequireID bool
	// Logger gets a line per failed or refused record, never payloads.
	// Defaults to slog.Default(). Metrics: inbox.Config.Observe.
	Logger *slog.Logger
}

// Consumer polls a consumer group and applies each record with the
// inbox, committing a partition's offset only past records whose
// database transaction committed (or that are duplicates, parked or
// refused). Close stops polling, lets the records being handled finish,
// commits, and returns; records not handled are not committed and go to
// the partition's next owner.
type Consumer struct {
	cfg  ConsumerConfig
	log  *slog.Logger
	mu   sync.Mutex
	run  bool
	stop chan struct{}      // closed by Close
	poll context.CancelFunc // cancels the poll in progress
	hctx context.CancelFunc // cancels the handlers, if Close's ctx ends
	done chan struct{}
	once sync.Once
}

// NewConsumer checks cfg and returns a Consumer; Start starts it.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case cfg.Inbox == nil:
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Inbox is nil: create one with inbox.New")
	case cfg.Name == "":
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Name is empty: name the consumer for the inbox's de-duplication")
	case cfg.Client == nil:
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Client is nil")
	case cfg.Handler == nil:
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Handler is nil")
	case cfg.Concurrency < 0 || cfg.MaxPollRecords < 0:
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Concurrency and MaxPollRecords must not be negative; 0 means the default")
	}
	if g, _ := cfg.Client.OptValue(kgo.ConsumerGroup).(string); g == "" {
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Client has no consumer group: build it with kgo.ConsumerGroup(name)")
	}
	if off, _ := cfg.Client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Client commits offsets on its own: build it with kgo.DisableAutoCommit(), so that offsets move only after the database commit")
	}
	if block, _ := cfg.Client.OptValue(kgo.BlockRebalanceOnPoll).(bool); !block {
		return nil, errors.New("kafkaoutbox: ConsumerConfig.Client lets rebalances run during handling: build it with kgo.BlockRebalanceOnPoll()")
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.MaxPollRecords = cmp.Or(cfg.MaxPollRecords, DefaultMaxPollRecords)
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	return &Consumer{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start starts polling; ctx is the parent of the handlers' contexts. A
// second Start does nothing.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run {
		return nil
	}
	c.run = true
	base := context.WithoutCancel(ctx)
	pctx, pcancel := context.WithCancel(base)
	hctx, hcancel := context.WithCancel(base)
	c.poll, c.hctx = pcancel, hcancel
	go c.loop(pctx, hctx)
	return nil
}

func (c *Consumer) loop(pctx, hctx context.Context) {
	defer close(c.done)
	cl := c.cfg.Client
	for {
		fetches := cl.PollRecords(pctx, c.cfg.MaxPollRecords)
		if c.stopping() || fetches.IsClientClosed() {
			cl.AllowRebalance()
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("kafkaoutbox: fetch", slog.String("topic", topic), slog.Int("partition", int(p)), slog.Any("error", err))
			}
		})
		settled := c.handleFetches(hctx, fetches)
		if len(settled) > 0 {
			if err := cl.CommitRecords(context.WithoutCancel(hctx), settled...); err != nil {
				// The records come again; the inbox sees duplicates.
				c.log.Warn("kafkaoutbox: commit offsets", slog.String("consumer", c.cfg.Name), slog.Any("error", err))
			}
		}
		cl.AllowRebalance()
	}
}

func (c *Consumer) stopping() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// handleFetches handles each partition's records in order, partitions
// in parallel, and returns the last settled record of each partition.
func (c *Consumer) handleFetches(ctx context.Context, fetches kgo.Fetches) []*kgo.Record {
	var (
		mu      sync.Mutex
		settled []*kgo.Record
		wg      sync.WaitGroup
		sem     = make(chan struct{}, c.cfg.Concurrency)
	)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if last := c.handlePartition(ctx, p.Records); last != nil {
				mu.Lock()
				settled = append(settled, last)
				mu.Unlock()
			}
		})
	})
	wg.Wait()
	return settled
}

// handlePartition handles recs in order and returns the last one settled;
// it stops early when Close begins while a record is failing.
func (c *Consumer) handlePartition(ctx context.Context, recs []*kgo.Record) (last *kgo.Record) {
	for _, r := range recs {
		if !c.handleRecord(ctx, r) {
			return last
		}
		last = r
	}
	return last
}

// handleRecord applies r, retrying in place, and reports whether it is
// settled (applied, duplicate, parked or refused).
func (c *Consumer) handleRecord(ctx context.Context, r *kgo.Record) bool {
	m, err := c.message(r)
	if err != nil {
		c.refuse(r, err)
		return true
	}
	for attempt := 1; ; attempt++ {
		res, err := c.cfg.Inbox.Handle(ctx, c.cfg.Name, m, c.cfg.Handler)
		switch {
		case res.Settled():
			return true
		case res == inbox.Rejected:
			c.refuse(r, err)
			return true
		}
		c.log.Warn("kafkaoutbox: handler failed; retrying the record", slog.String("consumer", c.cfg.Name), slog.String("message_id", m.ID),
			slog.Int("attempt", attempt), slog.Any("error", err))
		t := time.NewTimer(c.cfg.RetryBackoff(attempt))
		select {
		case <-t.C:
		case <-c.stop:
			t.Stop()
			return false
		}
	}
}

func (c *Consumer) refuse(r *kgo.Record, err error) {
	c.log.Error("kafkaoutbox: record refused and skipped", slog.String("consumer", c.cfg.Name), slog.String("topic", r.Topic),
		slog.Int("partition", int(r.Partition)), slog.Int64("offset", r.Offset), slog.Any("error", err))
}

// message converts r; its id is the txoutbox-id header, else (unless
// RequireID) its coordinates.
func (c *Consumer) message(r *kgo.Record) (inbox.Message, error) {
	m := inbox.Message{Payload: r.Value}
	if len(r.Headers) > 0 {
		m.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			if _, dup := m.Headers[h.Key]; !dup {
				m.Headers[h.Key] = string(h.Value)
			}
		}
	}
	m.ID = m.Headers[meta.ID]
	if m.ID == "" && !c.cfg.RequireID {
		m.ID = inbox.DeriveID("kafka", r.Topic, strconv.Itoa(int(r.Partition)), strconv.FormatInt(r.Offset, 10))
	}
	if m.ID == "" {
		return m, fmt.Errorf("kafkaoutbox: record without a %s header (RequireID is set): %w", meta.ID, inbox.ErrNoID)
	}
	return m, nil
}

// Close stops polling, waits for the records being handled (a record
// waiting for a retry stops waiting), commits the offsets of the settled
// ones and returns. If ctx ends first, the handlers' context is
// cancelled, Close waits for them to return and returns ctx's error.
// Close does not close the client: close it after Close so that the
// group hands its partitions on.
func (c *Consumer) Close(ctx context.Context) error {
	c.mu.Lock()
	run := c.run
	c.mu.Unlock()
	if !run {
		return nil
	}
	c.once.Do(func() { close(c.stop); c.poll() })
	var err error
	select {
	case <-c.done:
	case <-ctx.Done():
		err = ctx.Err()
		c.hctx()
		<-c.done
	}
	c.hctx()
	return err
}
