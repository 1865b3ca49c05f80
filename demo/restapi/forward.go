package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
)

// The stream and subjects the demo forwards to with NATS_URL set;
// cmd/natstail reads them.
const (
	natsStream        = "ORDERS"
	natsSubjectPrefix = "orders" // subjects orders.OrderPlaced, orders.OrderCancelled
)

// Subscription names of the connectors: each has its own progress,
// retries and circuit, apart from the in-process listeners.
const (
	subToNATS    = "to-nats"
	subToWebhook = "to-webhook"
)

// webhookMaxBody is what cmd/hookrecv accepts; a bigger event would be
// refused by it, so the connector refuses it first (DEAD at once).
const webhookMaxBody = 1 << 20

// forwarders are the connections of the connectors that are configured.
type forwarders struct {
	nc   *nats.Conn
	hook *webhook.Publisher
}

// subscribeForwarders subscribes the connectors that o.config configures: every
// event to NATS JetStream (NATS_URL) and to a webhook (WEBHOOK_URL,
// signed with WEBHOOK_SECRET). Nothing configured, nothing done. It runs
// before the outbox starts; close runs after the outbox closed.
func subscribeForwarders(ctx context.Context, o appOptions, ob *outbox.Outbox, log *slog.Logger) (_ *forwarders, err error) {
	cfg := o.config
	f := &forwarders{}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if cfg.NATSURL != "" {
		stream := cmp.Or(o.natsStream, natsStream)
		prefix := cmp.Or(o.natsSubjectPrefix, natsSubjectPrefix)
		// Reconnect for ever: while NATS is away the outbox waits (the
		// subscription's circuit opens, no attempts are spent) and the
		// events are published once it is back.
		f.nc, err = nats.Connect(cfg.NATSURL, nats.Name("txoutbox-demo"), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("restapi: connect to NATS at %s (NATS_URL): %w; start a NATS server with JetStream (nats-server -js) or unset NATS_URL", cfg.NATSURL, err)
		}
		js, err := jetstream.New(f.nc)
		if err != nil {
			return nil, err
		}
		sub := outbox.Subscription{Name: subToNATS}
		// The duplicate window covers the outbox's retries, so that
		// JetStream drops the copy of an event whose acknowledgement was
		// lost (Nats-Msg-Id is the event id).
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateStream(sctx, jetstream.StreamConfig{
			Name:       stream,
			Subjects:   []string{prefix + ".>"},
			Duplicates: natsoutbox.RetrySpan(sub, ob.Config()) + time.Minute,
		}); err != nil {
			return nil, fmt.Errorf("restapi: create the NATS stream %s: %w (is JetStream enabled? nats-server -js)", stream, err)
		}
		pub, err := natsoutbox.New(js, natsoutbox.Config{Subject: prefix + ".{type}", Stream: stream, ShortWindow: natsoutbox.WindowRefuse, Logger: log})
		if err != nil {
			return nil, err
		}
		sub.Batch = pub.Handler()
		if err := pub.Check(sctx, sub, ob.Config()); err != nil { // the stream's duplicate window covers the retries
			return nil, err
		}
		if err := ob.Subscribe(sub); err != nil {
			return nil, err
		}
		log.Info("forwarding events to NATS", slog.String("url", f.nc.ConnectedUrlRedacted()), slog.String("stream", stream), slog.String("subjects", prefix+".<type>"))
	}
	if cfg.WebhookURL != "" {
		if cfg.WebhookSecret == "" {
			return nil, errors.New("restapi: WEBHOOK_URL is set but WEBHOOK_SECRET is not: every request is signed; `go run ./demo/restapi/cmd/hookrecv` prints a secret to use")
		}
		f.hook, err = webhook.New(webhook.Config{
			URL:          cfg.WebhookURL,
			Secret:       cfg.WebhookSecret,
			Timeout:      5 * time.Second,
			MaxBodyBytes: webhookMaxBody,
		})
		if err != nil {
			return nil, fmt.Errorf("restapi: WEBHOOK_URL/WEBHOOK_SECRET: %w", err)
		}
		if err := ob.Subscribe(outbox.Subscription{Name: subToWebhook, Handler: f.hook.Handler()}); err != nil {
			return nil, err
		}
		log.Info("forwarding events to a webhook", slog.String("endpoint", redactURL(cfg.WebhookURL)))
	}
	return f, nil
}

// close closes the connections; the outbox must be closed first, since it
// may publish until Close returns.
func (f *forwarders) close() {
	if f == nil {
		return
	}
	if f.nc != nil {
		// Close, not Drain: the outbox, closed first, awaited the
		// acknowledgements of what it published, and nothing subscribes.
		f.nc.Close()
		f.nc = nil
	}
	if f.hook != nil {
		f.hook.Close()
		f.hook = nil
	}
}

// redactURL is a URL's scheme and host: its path, query and user info
// may hold tokens and stay out of the log.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host
}
