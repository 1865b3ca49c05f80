package amqpoutbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// DialFunc opens a connection to RabbitMQ. The Publisher owns what it
// returns and closes it when it is done with it. It should give up when
// ctx ends.
type DialFunc func(ctx context.Context) (*amqp.Connection, error)

// Unroutable says what becomes of an event the broker returns as
// unroutable: published to an exchange with no queue bound for its
// routing key.
type Unroutable int

const (
	// UnroutablePermanent makes the event DEAD at once, with the reason
	// in its last error: nothing would receive it. The default.
	UnroutablePermanent Unroutable = iota
	// UnroutableRetry fails the attempt: the event is retried with
	// back-off, and goes DEAD after the subscription's MaxAttempts.
	UnroutableRetry
	// UnroutableUnavailable treats a missing queue as an outage of the
	// destination: no attempt is spent and the subscription's circuit
	// opens until a queue is bound (for queues declared by consumers that
	// may start later).
	UnroutableUnavailable
	// UnroutableDrop publishes without the mandatory flag: the broker
	// drops an unroutable message silently and the event counts as
	// delivered.
	UnroutableDrop
)

// Defaults of Config.
const (
	// DefaultRoutingKey routes each event by its type.
	DefaultRoutingKey = "{type}"
	// DefaultMaxMessageBytes is RabbitMQ's default max_message_size
	// (128 MiB).
	DefaultMaxMessageBytes = 128 << 20
	// DefaultDialTimeout bounds opening a connection with Config.URL.
	DefaultDialTimeout = 10 * time.Second
	// DefaultHeartbeat is the heartbeat interval asked for with Config.URL.
	DefaultHeartbeat = 10 * time.Second
)

// ErrClosed is the error (marked Unavailable) of a call after Close.
var ErrClosed = errors.New("amqpoutbox: publisher closed")

// Config configures a Publisher. Exactly one of URL and Dial must be set.
type Config struct {
	// URL is the broker's AMQP URI, e.g. amqp://user:pass@host:5672/vhost.
	URL string
	// Dial opens a connection, for TLS, other credentials or connection
	// properties than URL gives.
	Dial DialFunc
	// DialTimeout bounds opening a connection with URL (TCP and AMQP
	// handshake). Defaults to DefaultDialTimeout.
	DialTimeout time.Duration

	// Exchange is the exchange messages are published to; "" is the
	// default exchange, which routes to the queue named by the routing
	// key. It must exist: the Publisher does not declare it, and reports
	// a missing exchange as the destination being unavailable.
	Exchange string
	// RoutingKey is the routing key template: text with fields in braces,
	// {type}, {aggregate_type}, {aggregate_id} or {tenant_id}, replaced by
	// the event's. Defaults to DefaultRoutingKey ("{type}"). An invalid
	// template fails New.
	RoutingKey string
	// Unroutable says what becomes of an event no queue takes. Defaults
	// to UnroutablePermanent.
	Unroutable Unroutable
	// MaxMessageBytes is the largest message body sent: a bigger payload
	// is Permanent at once. Set it to the broker's max_message_size if
	// that is lower than RabbitMQ's default. Defaults to
	// DefaultMaxMessageBytes; the outbox itself takes payloads of up to
	// outbox.MaxPayloadBytes.
	MaxMessageBytes int
}

// Publisher publishes outbox events to RabbitMQ with publisher confirms.
// It owns one connection and one channel, opened on the first call and
// opened again on the next call after they were lost. Its methods are
// safe for concurrent use; batches are published one at a time.
type Publisher struct {
	cfg  Config
	key  keyTemplate
	dial DialFunc

	// learnedMax is the max_message_size the broker reported when it
	// refused a message (0: none yet).
	learnedMax atomic.Int64

	sem    chan struct{} // held by one call at a time; guards s and closed
	s      *session
	closed bool
	wg     sync.WaitGroup // the sessions' goroutines

	// netConn is the socket of the current connection when the Publisher
	// dialled it (Config.URL): Close closes it to free a call stuck
	// writing to a broker that stopped reading.
	netMu   sync.Mutex
	netConn net.Conn
}

// New returns a Publisher. It does not connect: the first call does (see
// Connect to check the broker at start-up).
func New(cfg Config) (*Publisher, error) {
	if (cfg.URL == "") == (cfg.Dial == nil) {
		return nil, errors.New("amqpoutbox: set exactly one of Config.URL and Config.Dial")
	}
	if cfg.RoutingKey == "" {
		cfg.RoutingKey = DefaultRoutingKey
	}
	key, err := parseKey(cfg.RoutingKey)
	if err != nil {
		return nil, err
	}
	if cfg.Unroutable < UnroutablePermanent || cfg.Unroutable > UnroutableDrop {
		return nil, fmt.Errorf("amqpoutbox: Config.Unroutable %d is not one of the Unroutable constants", cfg.Unroutable)
	}
	if cfg.MaxMessageBytes < 0 {
		return nil, fmt.Errorf("amqpoutbox: Config.MaxMessageBytes is %d; it must be positive, or 0 for the default", cfg.MaxMessageBytes)
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if _, err := amqp.ParseURI(cfg.URL); cfg.URL != "" && err != nil {
		return nil, fmt.Errorf("amqpoutbox: Config.URL: %w", err)
	}
	p := &Publisher{cfg: cfg, key: key, dial: cfg.Dial, sem: make(chan struct{}, 1)}
	if p.dial == nil {
		p.dial = p.dialURL
	}
	return p, nil
}

func (p *Publisher) dialURL(ctx context.Context) (*amqp.Connection, error) {
	timeout := p.cfg.DialTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("txoutbox")
	dial := amqp.DefaultDial(timeout)
	return amqp.DialConfig(p.cfg.URL, amqp.Config{
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err == nil {
				p.netMu.Lock()
				p.netConn = c
				p.netMu.Unlock()
			}
			return c, err
		},
		Heartbeat:  DefaultHeartbeat,
		Locale:     "en_US",
		Properties: props,
	})
}

// Handler returns the batch handler to subscribe:
//
//	ob.Subscribe(outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()})
func (p *Publisher) Handler() outbox.BatchHandler { return p.Publish }

// Connect opens the connection and channel now, if they are not open,
// and checks that the exchange exists: for a service that wants to fail
// at start-up rather than at its first event. Calls connect by
// themselves; Connect is optional.
func (p *Publisher) Connect(ctx context.Context) error {
	if err := p.acquire(ctx); err != nil {
		return err
	}
	defer p.release()
	s, err := p.session(ctx)
	if err != nil {
		return err
	}
	if p.cfg.Exchange == "" {
		return nil
	}
	ch, err := s.conn.Channel() // a passive declare that fails closes its channel
	if err != nil {
		p.discard()
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: open a channel: %w", err), 0)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclarePassive(p.cfg.Exchange, "", false, false, false, false, nil); err != nil {
		return fmt.Errorf("amqpoutbox: exchange %q: %w", p.cfg.Exchange, err)
	}
	return nil
}

// Close closes the connection and waits for the Publisher's goroutines
// to end. A batch in flight finishes first. Calls after Close return
// ErrClosed, marked Unavailable.
func (p *Publisher) Close() error {
	select {
	case p.sem <- struct{}{}:
	case <-time.After(time.Second):
		// A call is stuck writing to a broker that stopped reading
		// (a resource alarm): free it by closing the socket.
		p.netMu.Lock()
		if p.netConn != nil {
			p.netConn.Close()
		}
		p.netMu.Unlock()
		p.sem <- struct{}{}
	}
	p.closed = true
	p.discard()
	p.release()
	p.wg.Wait()
	return nil
}

// acquire takes the Publisher for one call, or gives up when ctx ends.
func (p *Publisher) acquire(ctx context.Context) error {
	select {
	case p.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: the previous batch is still being published (a broker that stopped reading?): %w", ctx.Err()), 0)
	}
}

func (p *Publisher) release() { <-p.sem }

// Publish publishes evs and waits for the broker's confirms. It returns
// nil when every event was confirmed, a *outbox.BatchError with the
// outcome of each event otherwise, or an error marked outbox.Unavailable
// when it could not reach the broker at all. It is the Handler.
func (p *Publisher) Publish(ctx context.Context, evs []outbox.Event) error {
	if len(evs) == 0 {
		return nil
	}
	b := p.newBatch(evs)

	if err := p.acquire(ctx); err != nil {
		return outcome(fill(b.errs, err))
	}
	defer p.release()
	s, err := p.session(ctx)
	if err == nil {
		err = s.blockedError()
	}
	if err != nil {
		return outcome(fill(b.errs, err))
	}
	s.clearReturns()

	mandatory := p.cfg.Unroutable != UnroutableDrop
	lost := p.send(ctx, s, b, mandatory)
	unconfirmed := p.awaitConfirms(ctx, s, b)
	// A message the broker returns arrives before its ack: once every
	// ack is in, the returns of this batch are too.
	if mandatory && s.sync() {
		p.takeReturns(s, b)
	}
	if lost != nil || unconfirmed || s.broken() {
		p.discard()
	}
	return outcome(b.errs)
}

// batch is one call of Publish: per event, its message and routing key,
// its outcome so far (nil: none yet) and the confirm awaited for it (nil:
// not sent, or its outcome is settled).
type batch struct {
	msgs []amqp.Publishing
	keys []string
	errs []error
	dcs  []*amqp.DeferredConfirmation
}

// newBatch builds the messages of evs; an event whose message cannot be
// built has its Permanent error as its outcome.
func (p *Publisher) newBatch(evs []outbox.Event) *batch {
	b := &batch{
		msgs: make([]amqp.Publishing, len(evs)),
		keys: make([]string, len(evs)),
		errs: make([]error, len(evs)),
		dcs:  make([]*amqp.DeferredConfirmation, len(evs)),
	}
	for i := range evs {
		b.msgs[i], b.keys[i], b.errs[i] = p.message(&evs[i])
	}
	return b
}

// send publishes on s each message of b that has no outcome yet, keeping
// its confirm in b.dcs. Once a publish fails (the session broke or ctx
// ended) it sends no more and returns that error, which is the outcome of
// the messages not sent; while the session is broken, each has the
// outcome its own size gives (the broker may have closed the channel for
// a message over its max_message_size).
func (p *Publisher) send(ctx context.Context, s *session, b *batch, mandatory bool) (lost error) {
	for i := range b.msgs {
		if b.errs[i] != nil {
			continue
		}
		if lost != nil && s.broken() {
			b.errs[i] = p.lostError(s, len(b.msgs[i].Body))
			continue
		}
		if lost == nil {
			dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, b.keys[i], mandatory, false, b.msgs[i])
			if err == nil {
				b.dcs[i] = dc
				continue
			}
			lost = p.publishError(ctx, s, err, len(b.msgs[i].Body))
		}
		b.errs[i] = lost
	}
	return lost
}

// publishError is the outcome of a message of size bytes whose publish on
// s failed with err.
func (p *Publisher) publishError(ctx context.Context, s *session, err error, size int) error {
	switch {
	case ctx.Err() != nil:
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: publish: %w", ctx.Err()), 0)
	case s.broken():
		return p.lostError(s, size)
	default:
		return outbox.Unavailable(fmt.Errorf("amqpoutbox: publish: %w", err), 0)
	}
}

// awaitConfirms waits for the confirm of each message of b that was sent,
// or for ctx to end. A message the broker did not ack gets its error as
// its outcome and leaves b.dcs. It reports whether s must be discarded:
// ctx ended before a confirm came, or s broke.
func (p *Publisher) awaitConfirms(ctx context.Context, s *session, b *batch) (discard bool) {
	for i, dc := range b.dcs {
		if dc == nil {
			continue
		}
		select {
		case <-dc.Done():
		case <-ctx.Done():
			b.errs[i] = outbox.Unavailable(fmt.Errorf("amqpoutbox: no confirm from the broker in time: %w", ctx.Err()), 0)
			b.dcs[i] = nil
			discard = true
			continue
		}
		if dc.Acked() {
			continue
		}
		b.dcs[i] = nil
		if s.broken() {
			b.errs[i] = p.lostError(s, len(b.msgs[i].Body))
			discard = true
		} else {
			b.errs[i] = errors.New("amqpoutbox: the broker refused the message (nack: an internal error of RabbitMQ, e.g. a queue that could not take it); retried")
		}
	}
	return discard
}

// takeReturns sets the outcome of each acked message of b that the broker
// returned as unroutable. Call it once s.sync has reported true.
func (p *Publisher) takeReturns(s *session, b *batch) {
	for i, dc := range b.dcs {
		if dc == nil {
			continue
		}
		if r, ok := s.takeReturn(b.msgs[i].MessageId); ok {
			b.errs[i] = p.unroutable(r)
		}
	}
}

// message builds ev's message and routing key, or the Permanent error
// that keeps it from the broker.
func (p *Publisher) message(ev *outbox.Event) (amqp.Publishing, string, error) {
	body := ev.Payload()
	if limit := p.maxBytes(); len(body) > limit {
		return amqp.Publishing{}, "", outbox.Permanent(fmt.Errorf("amqpoutbox: message too large: the payload is %d bytes, over the broker's limit of %d bytes (max_message_size; Config.MaxMessageBytes)", len(body), limit))
	}
	key := p.key.render(ev)
	if len(key) > MaxRoutingKeyLen {
		return amqp.Publishing{}, "", outbox.Permanent(fmt.Errorf("amqpoutbox: routing key of %d bytes (template %q), over AMQP's limit of %d", len(key), p.cfg.RoutingKey, MaxRoutingKeyLen))
	}
	hs := meta.Headers(ev)
	table := make(amqp.Table, len(hs))
	var contentType string
	for _, h := range hs {
		table[h.Key] = h.Value
		if h.Key == meta.ContentType {
			contentType = h.Value
		}
	}
	return amqp.Publishing{
		Headers:      table,
		ContentType:  contentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    ev.ID,
		Timestamp:    ev.OccurredAt.UTC(),
		Type:         string(ev.Type),
		Body:         body,
	}, key, nil
}

func (p *Publisher) maxBytes() int {
	if n := p.learnedMax.Load(); n > 0 && int(n) < p.cfg.MaxMessageBytes {
		return int(n)
	}
	return p.cfg.MaxMessageBytes
}

// unroutable is the outcome of a message the broker returned.
func (p *Publisher) unroutable(r amqp.Return) error {
	err := fmt.Errorf("amqpoutbox: unroutable: no queue is bound to exchange %q for routing key %q (%d %s)", r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText)
	switch p.cfg.Unroutable {
	case UnroutableRetry:
		return err
	case UnroutableUnavailable:
		return outbox.Unavailable(err, 0)
	}
	return outbox.Permanent(err)
}

// maxSizeRE matches RabbitMQ's reason for refusing a message that is over
// its max_message_size.
var maxSizeRE = regexp.MustCompile(`message size (\d+) is larger than configured max size (\d+)`)

// lostError is the outcome of a message of size bytes that was published
// on session s, not confirmed, and s broke.
func (p *Publisher) lostError(s *session, size int) error {
	err, limit := closeError(s.closeReason(), size)
	if limit > 0 {
		p.learnedMax.Store(int64(limit))
	}
	return err
}

// closeError is the outcome of a message of size bytes lost because the
// channel closed for reason (nil: the connection dropped), and the
// broker's max_message_size if reason gives it.
func closeError(reason *amqp.Error, size int) (err error, limit int) {
	if reason == nil {
		return outbox.Unavailable(errors.New("amqpoutbox: connection to RabbitMQ lost"), 0), 0
	}
	if reason.Code == amqp.PreconditionFailed {
		if m := maxSizeRE.FindStringSubmatch(reason.Reason); m != nil {
			limit, _ = strconv.Atoi(m[2])
			if limit > 0 && size > limit {
				return outbox.Permanent(fmt.Errorf("amqpoutbox: message too large: the payload is %d bytes, over the broker's max_message_size of %d bytes", size, limit)), limit
			}
		}
	}
	// Another message of the batch may have been the cause: this one is
	// sent again on a new channel, at no cost.
	return outbox.Unavailable(fmt.Errorf("amqpoutbox: RabbitMQ closed the channel: %w", reason), 0), limit
}

// session returns the open session, opening one if needed. p.sem is
// held.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	if p.closed {
		return nil, outbox.Unavailable(ErrClosed, 0)
	}
	if p.s != nil && !p.s.broken() {
		return p.s, nil
	}
	p.discard()
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, outbox.Unavailable(fmt.Errorf("amqpoutbox: connect to RabbitMQ: %w", err), 0)
	}
	s, err := openSession(conn)
	if err != nil {
		conn.CloseDeadline(time.Now().Add(time.Second))
		return nil, outbox.Unavailable(fmt.Errorf("amqpoutbox: open a confirm channel: %w", err), 0)
	}
	p.s = s
	p.wg.Go(s.watch)
	return s, nil
}

// discard closes the session, if any. p.sem is held.
func (p *Publisher) discard() {
	if p.s == nil {
		return
	}
	close(p.s.stop)
	p.s.conn.CloseDeadline(time.Now().Add(time.Second))
	p.s = nil
}

// fill sets every nil entry of errs to err.
func fill(errs []error, err error) []error {
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	return errs
}

// outcome is the handler's result for errs: nil, the one error of every
// event (a failure of the whole batch), or a *outbox.BatchError.
func outcome(errs []error) error {
	same := len(errs) > 0
	for _, err := range errs {
		if err != errs[0] {
			same = false
			break
		}
	}
	if same {
		return errs[0]
	}
	return &outbox.BatchError{Errs: errs}
}

// session is one connection and its confirm channel.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	chClosed   chan *amqp.Error
	connClosed chan *amqp.Error
	returns    chan amqp.Return
	blocking   chan amqp.Blocking
	barrier    chan chan struct{}
	stop       chan struct{}

	mu       sync.Mutex
	returned map[string]amqp.Return // by message id
	reason   *amqp.Error
	blocked  string // the reason RabbitMQ gave for blocking publishers, or ""
}

func openSession(conn *amqp.Connection) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	return &session{
		conn:       conn,
		ch:         ch,
		chClosed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		connClosed: conn.NotifyClose(make(chan *amqp.Error, 1)),
		returns:    ch.NotifyReturn(make(chan amqp.Return, 64)),
		blocking:   conn.NotifyBlocked(make(chan amqp.Blocking, 4)),
		barrier:    make(chan chan struct{}),
		stop:       make(chan struct{}),
		returned:   map[string]amqp.Return{},
	}, nil
}

// watch records the messages the broker returns, and whether it blocks
// publishers, until the session is discarded.
func (s *session) watch() {
	returns, blocking := s.returns, s.blocking
	for {
		select {
		case b, ok := <-blocking:
			if !ok {
				blocking = nil
				continue
			}
			s.mu.Lock()
			s.blocked = ""
			if b.Active {
				s.blocked = b.Reason
			}
			s.mu.Unlock()
		case r, ok := <-returns:
			if !ok {
				returns = nil // the channel closed; serve barriers until stop
				continue
			}
			s.mu.Lock()
			s.returned[r.MessageId] = r
			s.mu.Unlock()
		case done := <-s.barrier:
			close(done)
		case <-s.stop:
			return
		}
	}
}

// sync waits until watch has recorded every return it received;
// it reports false if the session was discarded meanwhile.
func (s *session) sync() bool {
	done := make(chan struct{})
	select {
	case s.barrier <- done:
		<-done
		return true
	case <-s.stop:
		return false
	}
}

func (s *session) clearReturns() {
	s.mu.Lock()
	clear(s.returned)
	s.mu.Unlock()
}

func (s *session) takeReturn(id string) (amqp.Return, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.returned[id]
	delete(s.returned, id)
	return r, ok
}

// blockedError is an Unavailable error while RabbitMQ blocks publishers
// (a memory or disk alarm), nil otherwise.
func (s *session) blockedError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked == "" {
		return nil
	}
	return outbox.Unavailable(fmt.Errorf("amqpoutbox: RabbitMQ blocks publishers: %s", s.blocked), 0)
}

func (s *session) broken() bool { return s.ch.IsClosed() || s.conn.IsClosed() }

// closeReason is why the channel or connection closed, if the broker or
// the library said.
func (s *session) closeReason() *amqp.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason != nil || s.chClosed == nil {
		return s.reason
	}
	// The library marks the channel closed a moment before it sends the
	// reason, then closes these channels: the wait is short.
	wait := func(c chan *amqp.Error) *amqp.Error {
		t := time.NewTimer(200 * time.Millisecond)
		defer t.Stop()
		select {
		case e := <-c:
			return e
		case <-t.C:
			return nil
		}
	}
	if s.ch.IsClosed() {
		s.reason = wait(s.chClosed)
	}
	if s.reason == nil && s.conn.IsClosed() {
		s.reason = wait(s.connClosed)
	}
	s.chClosed, s.connClosed = nil, nil
	return s.reason
}
