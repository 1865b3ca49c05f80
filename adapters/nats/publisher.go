package natsoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/adapters/internal/conn"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Config configures a Publisher. The zero value publishes to
// "events.{type}" and warns when a stream's duplicate window is shorter
// than a subscription's retry span.
type Config struct {
	// Subject is the subject template; see the Placeholder constants and
	// Token for how events fill it. Defaults to DefaultSubject.
	Subject string
	// Stream is the JetStream stream the subjects belong to, for Check.
	// Empty: Check looks the stream up by the subjects of the
	// subscription's types.
	Stream string
	// ShortWindow is what Check does when the stream's duplicate window
	// is shorter than the subscription's retry span. Defaults to
	// WindowWarn.
	ShortWindow WindowPolicy
	// Logger receives Check's warnings. Defaults to slog.Default().
	Logger *slog.Logger
}

// Publisher publishes events to JetStream. It is safe for concurrent use.
type Publisher struct {
	js   jetstream.JetStream
	tmpl *template
	cfg  Config
	log  *slog.Logger
}

// New returns a Publisher that publishes through js. It fails if the
// subject template is invalid.
func New(js jetstream.JetStream, cfg Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("natsoutbox: New: nil JetStream")
	}
	if cfg.Subject == "" {
		cfg.Subject = DefaultSubject
	}
	tmpl, err := parseTemplate(cfg.Subject)
	if err != nil {
		return nil, err
	}
	switch cfg.ShortWindow {
	case WindowWarn, WindowRefuse, WindowIgnore:
	default:
		return nil, fmt.Errorf("natsoutbox: New: unknown ShortWindow %d", cfg.ShortWindow)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Publisher{js: js, tmpl: tmpl, cfg: cfg, log: log}, nil
}

// Subject returns the subject ev is published to.
func (p *Publisher) Subject(ev *outbox.Event) string { return p.tmpl.subject(ev) }

// Message returns the message ev is published as: its subject, the
// Nats-Msg-Id header (the event id, for JetStream's de-duplication), the
// metadata headers of outbox/meta, and the payload as the
// body. An event header whose name starts with "Nats-" (in any case) is
// left out: those headers instruct the server (Nats-Msg-Id, Nats-Rollup,
// Nats-Expected-…, Nats-TTL), and an event must not be able to replace
// its de-duplication id or purge a subject.
func (p *Publisher) Message(ev *outbox.Event) *nats.Msg {
	hs := meta.Headers(ev)
	h := make(nats.Header, len(hs)+1)
	for _, x := range hs {
		if len(x.Key) >= 5 && strings.EqualFold(x.Key[:5], "nats-") {
			continue
		}
		h[x.Key] = []string{x.Value}
	}
	h[jetstream.MsgIDHeader] = []string{ev.ID}
	return &nats.Msg{Subject: p.tmpl.subject(ev), Header: h, Data: ev.Payload()}
}

// Handler returns the batch handler to subscribe:
//
//	ob.Subscribe(outbox.Subscription{Name: "to-nats", Batch: pub.Handler()})
//
// or, with the duplicate-window check, pub.Subscribe. Each call publishes
// its events asynchronously, then waits for every acknowledgement; each
// event gets its own outcome:
//
//   - acknowledged by the stream (also as a duplicate): delivered;
//   - bigger than the server's max_payload, or than the stream's
//     max_msg_size: outbox.Permanent (DEAD at once);
//   - not connected, no responders (no stream, or JetStream down),
//     timeouts, a server error 503, a connection lost or reset under the
//     call or while waiting:
//     outbox.Unavailable (no attempt spent; the circuit opens);
//   - any other error of the server: an ordinary failure, retried.
func (p *Publisher) Handler() outbox.BatchHandler { return p.publish }

// Publish publishes evs and waits for their acknowledgements, as the
// handler returned by Handler does: nil when every event was stored, a
// *outbox.BatchError otherwise (or an error for the whole batch when the
// connection is down).
func (p *Publisher) Publish(ctx context.Context, evs []outbox.Event) error {
	return p.publish(ctx, evs)
}

func (p *Publisher) publish(ctx context.Context, evs []outbox.Event) error {
	nc := p.js.Conn()
	if !nc.IsConnected() {
		return outbox.Unavailable(fmt.Errorf("natsoutbox: not connected to NATS (%v)", nc.Status()), 0)
	}
	maxPayload := nc.MaxPayload()
	errs := make([]error, len(evs))
	futures := make([]jetstream.PubAckFuture, len(evs))
	failed := false
	for i := range evs {
		msg := p.Message(&evs[i])
		if size := msgSize(msg); maxPayload > 0 && size > maxPayload {
			errs[i] = outbox.Permanent(fmt.Errorf("natsoutbox: event %s is %d bytes with its headers, over the server's max_payload of %d bytes", evs[i].ID, size, maxPayload))
			failed = true
			continue
		}
		f, err := p.js.PublishMsgAsync(msg)
		if err != nil {
			errs[i] = classify(evs[i].ID, msg.Subject, err)
			failed = true
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		var err error
		select {
		case <-f.Ok():
		case err = <-f.Err():
		case <-ctx.Done():
			// The ack may still be ready: prefer it.
			select {
			case <-f.Ok():
			case err = <-f.Err():
			default:
				err = fmt.Errorf("natsoutbox: no acknowledgement before the handler's timeout: %w", ctx.Err())
			}
		}
		if err != nil {
			errs[i] = classify(evs[i].ID, f.Msg().Subject, err)
			failed = true
		}
	}
	if !failed {
		return nil
	}
	return &outbox.BatchError{Errs: errs}
}

// msgSize is the size the server checks against max_payload: the encoded
// headers and the body.
func msgSize(m *nats.Msg) int64 {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range m.Header {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return int64(n + len(m.Data))
}

// classify maps a publish error onto the outbox's outcomes.
func classify(id, subject string, err error) error {
	wrapped := fmt.Errorf("natsoutbox: publish event %s to %q: %w", id, subject, err)
	switch {
	case errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return outbox.Permanent(fmt.Errorf("natsoutbox: event %s is bigger than the stream's max_msg_size (maximum message size exceeded): %w", id, err))
	case errors.Is(err, nats.ErrMaxPayload):
		return outbox.Permanent(wrapped)
	case errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout),
		errors.Is(err, jetstream.ErrTooManyStalledMsgs),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrStaleConnection),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		// The connection broke under the call (a write or read reset, a
		// closed socket): the client reconnects on its own.
		conn.Broken(err):
		return outbox.Unavailable(wrapped, 0)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return outbox.Unavailable(wrapped, 0)
	}
	return wrapped
}

// Subscribe checks sub against the stream's duplicate window (Check, with
// ob.Config()), sets sub.Batch to the publisher's Handler and subscribes it
// to ob. Call it before ob.Start.
//
// Deprecated: attach the connector as every connector is attached,
// ob.Subscribe(outbox.Subscription{Name: …, Batch: pub.Handler()}), after
// pub.Check(ctx, sub, ob.Config()).
func (p *Publisher) Subscribe(ctx context.Context, ob *outbox.Outbox, sub outbox.Subscription) error {
	sub.Handler, sub.Tx, sub.Batch = nil, nil, p.Handler()
	if err := p.Check(ctx, sub, ob.Config()); err != nil {
		return err
	}
	return ob.Subscribe(sub)
}
