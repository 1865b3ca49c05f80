// Package kafkaoutbox delivers outbox events to Kafka with franz-go
// (github.com/twmb/franz-go/pkg/kgo).
//
// A Publisher is a batch subscription handler: every event of a batch
// becomes one record, produced through the caller's *kgo.Client, and each
// event gets its own outcome.
//
//	cl, _ := kgo.NewClient(kgo.SeedBrokers("kafka:9092"))
//	pub, _ := kafkaoutbox.New(cl, kafkaoutbox.Config{Topic: "orders"})
//	ob.Subscribe(outbox.Subscription{Name: "to-kafka", Batch: pub.Handler()})
//
// The record's value is the payload byte for byte, its headers are the
// metadata every connector sets (txoutbox-id, txoutbox-type, …, see
// adapters/README.md), its key is the event's ordering key by default
// ([outbox.Envelope.Key]: OrderingKey, else "AggregateType:AggregateID"), so
// that the events of one key land on one partition.
//
// Order: the partition keeps the order in which the outbox delivers. For a
// key's events to reach the partition in their publish order, the
// subscription must be ordered (Subscription.Order: outbox.Ordered or
// outbox.OrderedSkipDead): the outbox then hands the connector a key's
// next event only once Kafka acknowledged the previous one, so at most
// one record of a key is ever in flight. An unordered subscription may
// hand over several events of a key at once, in separate batches and
// workers, and they may land in any order. Within one batch the records
// are produced in batch order, and the client's idempotent producer
// (franz-go's default, which New insists on) keeps a partition's order
// across its own retries (Kafka checks the producer's sequence numbers
// per partition, with up to 5 requests in flight; the client's
// MaxProduceRequestsInflightPerBroker has no effect then), so nothing
// needs configuring. A redelivery (a crash
// before the done mark, a lease taken over) still comes after the later
// events of its key: consumers de-duplicate on txoutbox-id and, if they
// care, drop an event older than the last one seen for its key.
//
// Delivery is at least once. The client's idempotent producer (franz-go's
// default; do not disable it, New refuses a client that does) removes the
// duplicates of its own retries within one producer session; an event
// redelivered by the outbox (a crash before the done mark was written, a
// lease taken over) is a second record with the same txoutbox-id header
// and key, on which consumers de-duplicate.
//
// Errors: a record the broker or the client refuses as too large
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE), an invalid record or topic
// name is permanent (the event goes DEAD at once); a broker that cannot
// be reached, a request timeout, a leader change or any other retriable
// Kafka error is an outage ([outbox.Unavailable]: no attempt is spent and
// the subscription's circuit opens); anything else, a topic that does not
// exist included, is retried with the subscription's back-off.
package kafkaoutbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/txoutbox/txoutbox/adapters/internal/conn"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// TypePlaceholder is replaced by the event type in a TopicTemplate.
const TypePlaceholder = "{type}"

// MaxTopicLen is the longest topic name Kafka accepts.
const MaxTopicLen = 249

// Config configures a Publisher. Exactly one of Topic, TopicTemplate and
// TopicFunc is required; the zero value of every other field means its
// default.
type Config struct {
	// Topic sends every event to the topic name.
	Topic string
	// TopicTemplate sends each event to the topic named by the template
	// with every "{type}" replaced by the event's type: "events.{type}"
	// sends an OrderPlaced event to "events.OrderPlaced". An event whose
	// type makes an invalid topic name goes DEAD with a permanent error.
	TopicTemplate string
	// TopicFunc chooses each event's topic. A name that is not a valid
	// Kafka topic makes the event go DEAD with a permanent error.
	TopicFunc func(ev *outbox.Event) string
	// Key computes a record's key. Records with equal keys go to one
	// partition, in the order the outbox delivers them; a key coarser than
	// the ordering key keeps that order, a finer one (such as
	// AggregateKey when OrderingKey groups several aggregates) loses it.
	// Defaults to OrderingKey: the event's ordering key, or no key when it
	// has none (the client's partitioner then spreads such records).
	Key func(ev *outbox.Event) []byte
	// AckTimeout bounds how long one Handler call waits for Kafka's
	// acknowledgements; records not acknowledged by then are reported
	// unavailable (an outage: no attempt is spent). Defaults to waiting
	// until shortly before the call's context deadline (the
	// subscription's Timeout): a fifth of the time left earlier, at most a
	// second, so that it answers before the engine gives up on it (which
	// would count an attempt). Without a deadline and without AckTimeout,
	// a call waits as long as Kafka is away.
	AckTimeout time.Duration
}

type config struct {
	topic    string
	template string
	topicFn  func(ev *outbox.Event) string
	key      func(ev *outbox.Event) []byte
	ack      time.Duration
}

// OrderingKey is the default record key: the event's ordering key
// ([outbox.Envelope.Key]: OrderingKey if set, else AggregateType and
// AggregateID joined by ":"), or nil when the event has none. It is the
// key whose events an ordered subscription delivers in order, so that
// order continues into the partition.
func OrderingKey(ev *outbox.Event) []byte {
	k := ev.Key()
	if k == "" {
		return nil
	}
	return []byte(k)
}

// AggregateKey is a record key of the event's aggregate id alone, or nil
// when it is empty: the default before ordering keys (Config.Key:
// AggregateKey keeps the earlier partitioning).
func AggregateKey(ev *outbox.Event) []byte {
	if ev.AggregateID == "" {
		return nil
	}
	return []byte(ev.AggregateID)
}

// Publisher produces outbox events to Kafka. It is safe for concurrent
// use; it starts no goroutine of its own (the client's do the work) and
// does not close the client.
type Publisher struct {
	client *kgo.Client
	cfg    config
}

// New returns a Publisher that produces through client, which the caller
// keeps and closes (after the outbox). Exactly one of Config.Topic,
// TopicTemplate and TopicFunc must be set. New fails when the client
// disables idempotent writes (kgo.DisableIdempotentWrite): without them a
// retried produce request can write a record twice, or out of order.
func New(client *kgo.Client, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("kafkaoutbox: New: client is nil")
	}
	c := config{topic: cfg.Topic, template: cfg.TopicTemplate, topicFn: cfg.TopicFunc, key: cfg.Key, ack: cfg.AckTimeout}
	if c.key == nil {
		c.key = OrderingKey
	}
	set := 0
	for _, given := range []bool{c.topic != "", c.template != "", c.topicFn != nil} {
		if given {
			set++
		}
	}
	if set != 1 {
		return nil, fmt.Errorf("kafkaoutbox: New: set exactly one of Config.Topic, TopicTemplate and TopicFunc (got %d)", set)
	}
	switch {
	case c.topicFn != nil:
	case c.template != "":
		if !strings.Contains(c.template, TypePlaceholder) {
			return nil, fmt.Errorf("kafkaoutbox: New: topic template %q has no %s; use Topic for a fixed topic", c.template, TypePlaceholder)
		}
		if err := ValidTopic(strings.ReplaceAll(c.template, TypePlaceholder, "x")); err != nil {
			return nil, fmt.Errorf("kafkaoutbox: New: topic template %q: %w", c.template, err)
		}
	default:
		if err := ValidTopic(c.topic); err != nil {
			return nil, fmt.Errorf("kafkaoutbox: New: %w", err)
		}
	}
	if c.ack < 0 {
		return nil, fmt.Errorf("kafkaoutbox: New: Config.AckTimeout %v is negative", c.ack)
	}
	if v, ok := client.OptValue(kgo.DisableIdempotentWrite).(bool); ok && v {
		return nil, errors.New("kafkaoutbox: New: the client disables idempotent writes (kgo.DisableIdempotentWrite): a retried produce could then duplicate or reorder records; remove that option")
	}
	return &Publisher{client: client, cfg: c}, nil
}

// ValidTopic reports why name is not a valid Kafka topic name, or nil:
// 1 to 249 ASCII letters, digits, '.', '_' or '-', and not "." or "..".
func ValidTopic(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > MaxTopicLen {
		return fmt.Errorf("invalid Kafka topic name %q: 1 to %d characters, not . or ..", name, MaxTopicLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("invalid Kafka topic name %q: only ASCII letters, digits, '.', '_' and '-'", name)
		}
	}
	return nil
}

// TopicOf returns the topic ev goes to.
func (p *Publisher) TopicOf(ev *outbox.Event) (string, error) {
	var t string
	switch {
	case p.cfg.topicFn != nil:
		t = p.cfg.topicFn(ev)
	case p.cfg.template != "":
		t = strings.ReplaceAll(p.cfg.template, TypePlaceholder, string(ev.Type))
	default:
		return p.cfg.topic, nil
	}
	return t, ValidTopic(t)
}

// Record returns the record ev becomes: its topic, key, the metadata
// headers (see adapters/README.md) and the payload as value. An error
// means the event cannot be produced (an invalid topic name) and is
// permanent.
func (p *Publisher) Record(ev *outbox.Event) (*kgo.Record, error) {
	topic, err := p.TopicOf(ev)
	if err != nil {
		return nil, outbox.Permanent(fmt.Errorf("kafkaoutbox: event %s: %w", ev.ID, err))
	}
	hs := meta.Headers(ev)
	rh := make([]kgo.RecordHeader, len(hs))
	for i, h := range hs {
		rh[i] = kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)}
	}
	return &kgo.Record{Topic: topic, Key: p.cfg.key(ev), Value: ev.Payload(), Headers: rh}, nil
}

// Handler returns the batch handler to subscribe:
//
//	ob.Subscribe(outbox.Subscription{Name: "to-kafka", Batch: pub.Handler()})
//
// It produces every event of the batch at once and waits for each
// record's acknowledgement (or for ctx: the subscription's Timeout bounds
// the wait, and records not acknowledged by then are reported
// unavailable). It returns nil when all were written, else a
// *outbox.BatchError with each event's outcome.
func (p *Publisher) Handler() outbox.BatchHandler { return p.produce }

// Publish produces one event and waits for its acknowledgement; it is an
// outbox.Handler, for a subscription that delivers one event per call.
func (p *Publisher) Publish(ctx context.Context, ev outbox.Event) error {
	err := p.produce(ctx, []outbox.Event{ev})
	var be *outbox.BatchError
	if errors.As(err, &be) {
		return be.Errs[0]
	}
	return err
}

func (p *Publisher) produce(ctx context.Context, evs []outbox.Event) error {
	ctx, cancel := p.ackContext(ctx)
	defer cancel()
	errs := make([]error, len(evs))
	recs := make([]*kgo.Record, len(evs))
	var idx []int // the events to produce
	for i := range evs {
		r, err := p.Record(&evs[i])
		if err != nil {
			errs[i] = err
			continue
		}
		recs[i] = r
		idx = append(idx, i)
	}
	p.send(ctx, evs, recs, idx, errs)

	// A broker refuses a whole batch when it is too large, good records
	// with the bad: produce each of them again alone, so that only a
	// record too large by itself is permanent.
	var large []int
	for _, i := range idx {
		if tooLarge(errs[i]) {
			large = append(large, i)
		}
	}
	if len(large) > 1 || (len(large) == 1 && len(idx) > 1) {
		for _, i := range large {
			if ctx.Err() != nil {
				// Not tried alone: it may well fit. A plain retry.
				errs[i] = fmt.Errorf("kafkaoutbox: event %s to topic %s: refused with the other records of its produce batch as too large, and no time left to produce it alone (%w)",
					evs[i].ID, recs[i].Topic, kerr.MessageTooLarge)
				continue
			}
			errs[i] = nil
			recs[i] = cloneRecord(recs[i])
			p.send(ctx, evs, recs, []int{i}, errs)
		}
	}

	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return &outbox.BatchError{Errs: errs}
}

// ackContext bounds the wait for acknowledgements (see AckTimeout).
func (p *Publisher) ackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d := p.cfg.ack
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		left -= min(left/5, time.Second)
		if d == 0 || left < d {
			d = max(left, time.Millisecond)
		}
	}
	if d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// send produces recs[i] for each i in idx and sets errs[i] to the
// classified outcome. It returns when every record was answered or ctx is
// done; the records still unanswered then are reported unavailable (the
// client may still write them: the outbox delivers them again, at least
// once).
func (p *Publisher) send(ctx context.Context, evs []outbox.Event, recs []*kgo.Record, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	// ProduceSync, not Produce with promises: it also ends the partitions'
	// linger (franz-go's default ProducerLinger is 10 ms), so a batch goes
	// out at once instead of waiting 10 ms, which capped a connector that
	// waits for each batch's acknowledgements at ~9k records/s.
	// It runs in a goroutine so that this call can return at ctx's end;
	// that goroutine ends when the client has answered every record (ctx
	// fails those still buffered; those sent are bounded by the client's
	// request timeouts), and its result channel is buffered.
	batch := make([]*kgo.Record, len(idx))
	pos := make(map[*kgo.Record]int, len(idx))
	for k, i := range idx {
		batch[k] = recs[i]
		pos[recs[i]] = i
	}
	done := make(chan kgo.ProduceResults, 1)
	go func() { done <- p.client.ProduceSync(ctx, batch...) }()
	select {
	case rs := <-done:
		for _, r := range rs {
			if i, ok := pos[r.Record]; ok {
				errs[i] = classify(&evs[i], recs[i], r.Err)
			}
		}
	case <-ctx.Done():
		for _, i := range idx {
			errs[i] = outbox.Unavailable(fmt.Errorf("kafkaoutbox: event %s to topic %s: no acknowledgement from Kafka: %w", evs[i].ID, recs[i].Topic, ctx.Err()), 0)
		}
	}
}

// cloneRecord copies what the caller set on a record, for producing it
// again (the client owns a record until its promise ran).
func cloneRecord(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

func tooLarge(err error) bool {
	return err != nil && (errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge))
}

// classify maps a produce error onto the outbox's outcomes.
func classify(ev *outbox.Event, r *kgo.Record, err error) error {
	if err == nil {
		return nil
	}
	werr := fmt.Errorf("kafkaoutbox: event %s to topic %s: %w", ev.ID, r.Topic, err)
	switch {
	case tooLarge(err):
		return outbox.Permanent(fmt.Errorf("kafkaoutbox: event %s to topic %s: the record (%d bytes of payload, %d of key and headers) is larger than Kafka accepts (the broker's message.max.bytes, the topic's max.message.bytes or the client's ProducerBatchMaxBytes): %w",
			ev.ID, r.Topic, len(r.Value), keyAndHeaders(r), err))
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.UnsupportedForMessageFormat):
		return outbox.Permanent(werr)
	case Unreachable(err):
		return outbox.Unavailable(werr, 0)
	}
	return werr
}

func keyAndHeaders(r *kgo.Record) int {
	n := len(r.Key)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Unreachable reports whether a produce error means Kafka could not be
// reached or did not answer in time, rather than refusing the record: a
// connection that failed or closed, a timeout, a retriable Kafka error
// (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, …), the client's own record
// timeout or retry limit, or a closed client. Such errors are outages.
// UNKNOWN_TOPIC_OR_PARTITION is not one: Kafka answered.
func Unreachable(err error) bool {
	var ke *kerr.Error
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		// Retriable for Kafka, but here Kafka answers and the topic is
		// missing: a configuration error to see (retries, then DEAD),
		// not an outage that parks the subscription. The client waited
		// for the topic to appear before failing the record.
		return false
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// The subscription's timeout, or the cancelled context of another
		// record batched with this one (the client fails a batch by its
		// first record's context).
		return true
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrClientClosed), errors.Is(err, kgo.ErrMaxBuffered):
		return true
	case errors.As(err, &ke):
		return ke.Retriable
	case conn.Broken(err):
		return true
	}
	return false
}
