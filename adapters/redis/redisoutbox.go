package redisoutbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txoutbox/txoutbox/adapters/internal/conn"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults of the options.
const (
	// DefaultStream is the stream key when no Stream or StreamTemplate
	// option is given.
	DefaultStream = "txoutbox"
	// DefaultPayloadField is the entry field that carries the payload.
	DefaultPayloadField = "payload"
	// DefaultMaxMessageBytes is the largest entry accepted by default:
	// Redis's default proto-max-bulk-len (512 MiB).
	DefaultMaxMessageBytes = 512 << 20
	// DedupSuffix is put between the stream key and the event id to name
	// the key that marks an event as stored with IdempotentTTL (see
	// Publisher.DedupKey).
	DedupSuffix = ":txoutbox-dedup:"
)

// luaUnpackLimit bounds the fields an idempotent XADD (IdempotentTTL) can take: the script
// unpacks them onto Lua's C stack (LUAI_MAXCSTACK is 8000 slots).
const luaUnpackLimit = 7900

// Publisher delivers outbox events to Redis Streams, one XADD per event,
// pipelined per batch. It is safe for concurrent use, starts no goroutine
// and does not own the client: whoever created the client closes it,
// after the outbox has been closed.
type Publisher struct {
	client       redis.UniversalClient
	stream       *template
	maxLen       int64
	maxBytes     int
	payloadField string
	dedupTTL     time.Duration
}

// Config configures a Publisher. Its zero value sends every event to the
// stream DefaultStream.
type Config struct {
	// Stream is the stream key of every event. Defaults to DefaultStream
	// when StreamTemplate is not set either; set at most one of the two.
	Stream string
	// StreamTemplate sets the stream key per event from a template whose
	// placeholders are replaced by the event's fields: ${type},
	// ${aggregate_type} and ${tenant}. For example "events:${type}" sends
	// an OrderPlaced event to "events:OrderPlaced". New rejects an unknown
	// placeholder; an event whose placeholder would be empty (no
	// aggregate type, no tenant) is dead at once (outbox.Permanent), as no
	// key can be built for it.
	StreamTemplate string
	// MaxLen trims each stream on every XADD to about MaxLen entries
	// (MAXLEN ~ n: Redis trims whole macro nodes, so a stream keeps at
	// least n entries and may keep a few more). A consumer that falls
	// more than n entries behind loses the oldest ones. Defaults to 0: no
	// trimming.
	MaxLen int64
	// MaxMessageBytes bounds the size of one stream entry: the bytes of
	// every field name and value, the payload included. An event above it
	// is dead at once (outbox.Permanent) with a reason that gives both
	// sizes. Set it to what your server and consumers accept
	// (proto-max-bulk-len, client buffers, maxmemory). Defaults to
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// PayloadField names the entry field that carries the payload. A
	// user header of the same name is left out of the entry. Defaults to
	// DefaultPayloadField ("payload").
	PayloadField string
	// IdempotentTTL, when set, makes a redelivered event (same id, same
	// stream) add no second entry: each event is added by a Lua script
	// that also sets a marker key (see Publisher.DedupKey) holding the
	// entry's id, which expires after IdempotentTTL, and that adds nothing
	// when the marker exists. It must cover the longest time an event can
	// be delivered again (its retries, an outage, a lease takeover); at
	// least a millisecond. Defaults to 0: one XADD per delivery, and
	// consumers de-duplicate on the txoutbox-id field.
	//
	// With Redis Cluster, the stream key and the marker must be in one
	// slot: the marker takes the stream's hash tag, or the whole key as
	// its tag when it has none; a key without a hash tag must then not
	// contain '}'.
	IdempotentTTL time.Duration
}

// New returns a Publisher that adds events to streams of client (a
// *redis.Client, *redis.ClusterClient or *redis.Ring). It checks cfg:
// both Stream and StreamTemplate, a template with an unknown placeholder,
// a negative MaxLen or MaxMessageBytes, or an IdempotentTTL under a
// millisecond are errors.
//
// Give the client small dial, read and write timeouts (a second or so):
// a broker that does not answer then fails the call quickly, and the
// outbox's circuit takes over (see Publisher.Handler).
func New(client redis.UniversalClient, cfg Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("redisoutbox: New: nil client")
	}
	if cfg.Stream != "" && cfg.StreamTemplate != "" {
		return nil, errors.New("redisoutbox: New: set at most one of Config.Stream and Config.StreamTemplate")
	}
	stream := cfg.Stream
	if stream == "" {
		stream = DefaultStream
	}
	t := &template{src: stream, parts: []part{{lit: stream}}}
	if cfg.StreamTemplate != "" {
		var err error
		if t, err = parseTemplate(cfg.StreamTemplate); err != nil {
			return nil, err
		}
	}
	payloadField := cfg.PayloadField
	if payloadField == "" {
		payloadField = DefaultPayloadField
	}
	switch {
	case cfg.MaxLen < 0:
		return nil, fmt.Errorf("redisoutbox: New: Config.MaxLen %d is negative", cfg.MaxLen)
	case cfg.MaxMessageBytes < 0:
		return nil, fmt.Errorf("redisoutbox: New: Config.MaxMessageBytes %d is negative", cfg.MaxMessageBytes)
	case meta.Reserved(payloadField) || payloadField == meta.ContentType:
		return nil, fmt.Errorf("redisoutbox: New: Config.PayloadField %q is a metadata field", payloadField)
	case cfg.IdempotentTTL != 0 && cfg.IdempotentTTL < time.Millisecond:
		return nil, fmt.Errorf("redisoutbox: New: Config.IdempotentTTL %v is under a millisecond", cfg.IdempotentTTL)
	}
	maxBytes := cfg.MaxMessageBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxMessageBytes
	}
	return &Publisher{client: client, stream: t, maxLen: cfg.MaxLen, maxBytes: maxBytes, payloadField: payloadField, dedupTTL: cfg.IdempotentTTL}, nil
}

// Handler returns the batch handler to subscribe:
//
//	ob.Subscribe(outbox.Subscription{Name: "to-redis", Batch: pub.Handler()})
//
// Each call sends one pipeline with an XADD per event and reports an
// outcome per event (*outbox.BatchError): an event above MaxMessageBytes,
// or whose stream key cannot be built, is dead at once (outbox.Permanent);
// a lost connection, a timeout, a full connection pool or a server that is
// loading, read-only or failing over is outbox.Unavailable (no attempt is
// spent; the subscription's circuit opens after a few in a row); any other
// error of the server (OOM, a command that is not allowed, a key of the
// wrong type) is an ordinary failure, retried with back-off.
func (p *Publisher) Handler() outbox.BatchHandler { return p.Publish }

// Handle delivers one event, for a subscription with a Handler instead of
// a Batch.
func (p *Publisher) Handle(ctx context.Context, ev outbox.Event) error {
	err := p.Publish(ctx, []outbox.Event{ev})
	var be *outbox.BatchError
	if errors.As(err, &be) {
		return be.Errs[0]
	}
	return err
}

// Publish adds evs to their streams in one pipeline. It returns nil when
// every event was stored, else an *outbox.BatchError with the outcome of
// each event.
func (p *Publisher) Publish(ctx context.Context, evs []outbox.Event) error {
	errs := make([]error, len(evs))
	var cmds []entry
	for i := range evs {
		e, err := p.entry(&evs[i])
		if err != nil {
			errs[i] = err
			continue
		}
		e.i = i
		cmds = append(cmds, e)
	}
	if len(cmds) > 0 {
		p.exec(ctx, cmds, errs)
	}
	for _, err := range errs {
		if err != nil {
			return &outbox.BatchError{Errs: errs}
		}
	}
	return nil
}

// entry is one event ready to send.
type entry struct {
	i      int
	stream string
	id     string
	values []any
}

// Fields returns the fields of ev's stream entry, in order: the metadata
// of outbox/meta (txoutbox-id first), then the payload field.
// It is what Publish sends, for tests and tools.
func (p *Publisher) Fields(ev *outbox.Event) []any {
	hs := meta.Headers(ev)
	v := make([]any, 0, 2*len(hs)+2)
	for _, h := range hs {
		if h.Key == p.payloadField {
			continue
		}
		v = append(v, h.Key, h.Value)
	}
	payload := ev.Payload()
	if payload == nil {
		payload = []byte{}
	}
	return append(v, p.payloadField, payload)
}

func (p *Publisher) entry(ev *outbox.Event) (entry, error) {
	stream, err := p.stream.expand(ev)
	if err != nil {
		return entry{}, outbox.Permanent(err)
	}
	values := p.Fields(ev)
	size := 0
	for _, v := range values {
		switch v := v.(type) {
		case string:
			size += len(v)
		case []byte:
			size += len(v)
		}
	}
	if size > p.maxBytes {
		return entry{}, outbox.Permanent(fmt.Errorf("redisoutbox: event %s is %d bytes as a stream entry (payload %d bytes), over MaxMessageBytes %d: it can never be stored", ev.ID, size, len(ev.Payload()), p.maxBytes))
	}
	if p.dedupTTL > 0 && len(values) > luaUnpackLimit {
		return entry{}, outbox.Permanent(fmt.Errorf("redisoutbox: event %s has %d fields, over the %d an idempotent XADD (Config.IdempotentTTL) can take", ev.ID, len(values)/2, luaUnpackLimit/2))
	}
	return entry{stream: stream, id: ev.ID, values: values}, nil
}

// addScript adds an entry unless the marker KEYS[2] exists, and sets the
// marker to the new entry's id with a ttl; it returns the entry's id, the
// new one or the one the marker holds.
//
//	KEYS[1] stream, KEYS[2] marker
//	ARGV[1] ttl in ms, ARGV[2] MAXLEN ~ (0: none), ARGV[3:] fields
var addScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[2])
if prev then return prev end
local id
if tonumber(ARGV[2]) > 0 then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return id
`)

func (p *Publisher) exec(ctx context.Context, es []entry, errs []error) {
	if p.dedupTTL <= 0 {
		pipe := p.client.Pipeline()
		res := make([]*redis.StringCmd, len(es))
		for k, e := range es {
			res[k] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: e.stream, MaxLen: p.maxLen, Approx: p.maxLen > 0, Values: e.values})
		}
		_, _ = pipe.Exec(ctx) // the outcomes are in the commands
		for k, e := range es {
			errs[e.i] = classify(e.stream, res[k].Err())
		}
		return
	}
	ttl := p.dedupTTL.Milliseconds()
	run := func(es []entry, eval bool) []error {
		pipe := p.client.Pipeline()
		res := make([]*redis.Cmd, len(es))
		for k, e := range es {
			args := make([]any, 0, 2+len(e.values))
			args = append(args, ttl, p.maxLen)
			args = append(args, e.values...)
			keys := []string{e.stream, p.DedupKey(e.stream, e.id)}
			if eval {
				res[k] = addScript.Eval(ctx, pipe, keys, args...)
			} else {
				res[k] = addScript.EvalSha(ctx, pipe, keys, args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		out := make([]error, len(es))
		for k := range es {
			out[k] = res[k].Err()
		}
		return out
	}
	out := run(es, false)
	var again []entry
	var where []int
	for k, err := range out {
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			again, where = append(again, es[k]), append(where, k)
		}
	}
	if len(again) > 0 { // the server's script cache was empty: send the script
		for k, err := range run(again, true) {
			out[where[k]] = err
		}
	}
	for k, e := range es {
		errs[e.i] = classify(e.stream, out[k])
	}
}

// DedupKey returns the key that marks the event id as stored in stream in
// IdempotentTTL mode: stream + DedupSuffix + id when the stream key has a hash
// tag, else "{" + stream + "}" + DedupSuffix + id, so that the marker is
// in the stream's Redis Cluster slot.
func (p *Publisher) DedupKey(stream, id string) string {
	if _, ok := hashTag(stream); ok || strings.IndexByte(stream, '}') >= 0 {
		return stream + DedupSuffix + id
	}
	return "{" + stream + "}" + DedupSuffix + id
}

// hashTag returns the part of key Redis Cluster hashes when it is not the
// whole key: what is between the first '{' and the next '}', if not empty.
func hashTag(key string) (string, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}

// classify maps the error of one XADD onto the outbox's outcomes.
func classify(stream string, err error) error {
	if err == nil {
		return nil
	}
	werr := fmt.Errorf("redisoutbox: XADD to stream %q: %w", stream, err)
	if Unreachable(err) {
		return outbox.Unavailable(werr, 0)
	}
	return werr
}

// Unreachable reports whether err means that the Redis server could not be
// reached or cannot take writes for now: a connection refused, reset or
// closed, a timeout (of the client or of the call's context), a full
// connection pool, a closed client, or a server that answers LOADING,
// BUSY, MASTERDOWN, READONLY, CLUSTERDOWN, TRYAGAIN, NOREPLICAS or "max
// number of clients reached". Publish marks these errors outbox.Unavailable.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, redis.ErrClosed),
		conn.Broken(err):
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		for _, prefix := range []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"} {
			if redis.HasErrorPrefix(err, prefix) {
				return true
			}
		}
		return strings.HasPrefix(rerr.Error(), "ERR max number of clients reached")
	}
	return false
}
