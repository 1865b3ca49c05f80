package amqpoutbox

import (
	"context"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/outbox"
)

func TestRoutingKeyTemplate(t *testing.T) {
	ev := &outbox.Event{Envelope: outbox.Envelope{Type: "order.created", AggregateType: "order", AggregateID: "42", TenantID: "t1"}}
	for tmpl, want := range map[string]string{
		"{type}":                                 "order.created",
		"events":                                 "events",
		"t.{tenant_id}.{aggregate_type}":         "t.t1.order",
		"{aggregate_type}.{aggregate_id}/{type}": "order.42/order.created",
	} {
		k, err := parseKey(tmpl)
		if err != nil {
			t.Errorf("%q: %v", tmpl, err)
			continue
		}
		if got := k.render(ev); got != want {
			t.Errorf("%q: %q; want %q", tmpl, got, want)
		}
	}
	for tmpl, want := range map[string]string{
		"{typ}":                             "unknown field {typ}",
		"{type":                             "'{' without '}'",
		"type}":                             "'}' without '{'",
		"{}":                                "unknown field {}",
		strings.Repeat("x", 256):            "over AMQP's limit",
		"{type}" + strings.Repeat("x", 255): "", // the fixed text fits
	} {
		_, err := parseKey(tmpl)
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", tmpl, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", tmpl, err, want)
		}
	}
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "exactly one of"},
		{Config{URL: "amqp://x", Dial: dialNothing}, "exactly one of"},
		{Config{URL: "http://x"}, "Config.URL"},
		{Config{URL: "amqp://x", RoutingKey: "{nope}"}, "unknown field"},
		{Config{URL: "amqp://x", Unroutable: 9}, "Unroutable"},
		{Config{URL: "amqp://x", MaxMessageBytes: -1}, "MaxMessageBytes"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v; want %q", c.cfg, err, c.want)
		}
	}
	p, err := New(Config{Dial: dialNothing})
	if err != nil || p.cfg.RoutingKey != DefaultRoutingKey || p.cfg.MaxMessageBytes != DefaultMaxMessageBytes {
		t.Errorf("defaults: %+v, %v", p, err)
	}
}

func dialNothing(ctx context.Context) (*amqp.Connection, error) { return nil, context.Canceled }

// A channel closed by the broker for a message over max_message_size:
// the message that is over the limit is Permanent, the others of the
// batch are sent again at no cost, and the limit is learnt.
func TestCloseError(t *testing.T) {
	reason := &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 2048 is larger than configured max size 1024"}
	err, limit := closeError(reason, 2048)
	if !isPermanent(err) || limit != 1024 || !strings.Contains(err.Error(), "too large") {
		t.Errorf("the big one: %v, limit %d", err, limit)
	}
	if err, _ := closeError(reason, 10); !isUnavailable(err) {
		t.Errorf("a small one in the same batch: %v; want Unavailable", err)
	}
	if err, _ := closeError(nil, 10); !isUnavailable(err) {
		t.Errorf("connection lost: %v; want Unavailable", err)
	}
	notFound := &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'"}
	if err, _ := closeError(notFound, 10); !isUnavailable(err) || !strings.Contains(err.Error(), "NOT_FOUND") {
		t.Errorf("missing exchange: %v; want Unavailable", err)
	}
}

func isPermanent(err error) bool { return outbox.DefaultClassifier(err) == outbox.DecisionDead }

func isUnavailable(err error) bool { ok, _ := outbox.IsUnavailable(err); return ok }
