package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
)

// Interceptor sees both ends of every event: its publication and each
// call of a subscription's handler. It is the seam for cross-cutting
// concerns such as tracing (github.com/txoutbox/txoutbox/adapters/otel
// stores the request's W3C trace context in the headers at Publish and
// makes a span of each delivery) without the core importing them.
// Interceptors are set in [Config.Interceptors] and apply in order: the
// first is the outermost.
type Interceptor interface {
	// Publish is called for each envelope given to Publish, PublishTx,
	// PublishAll or PublishAllTx, with the publisher's ctx, before the
	// envelope is validated and written. env.ID is set already (the
	// caller's, or a new ULID) and env.Headers is a map of the envelope's
	// own, never nil: Publish may add or change headers (they are then
	// validated and stored like the caller's). It must not keep env.
	// It is called even if the envelope turns out to be invalid, or its
	// transaction rolls back.
	Publish(ctx context.Context, env *Envelope)

	// Deliver wraps each handler call of subscription sub: evs holds the
	// one event of a Handler or Tx call, or the events of a Batch call.
	// It must call next exactly once, with ctx or a context derived from
	// it (the handler receives that context), and return next's error or
	// an error of its own; it must not modify the events, which the
	// subscriptions of an event share. It runs within the call's timeout,
	// and a panic in it counts as the handler's. A Deliver that returns
	// nil without calling next fails the attempt, and a second call of
	// next fails without calling the handler.
	Deliver(ctx context.Context, sub string, evs []Event, next func(context.Context) error) error
}

// interceptPublish returns env as the interceptors left it: with an id,
// and headers of its own (the caller's map is never modified).
func (o *Outbox) interceptPublish(ctx context.Context, env Envelope) Envelope {
	if len(o.cfg.Interceptors) == 0 {
		return env
	}
	if env.ID == "" {
		env.ID = NewID()
	}
	env.Headers = maps.Clone(env.Headers)
	if env.Headers == nil {
		env.Headers = make(map[string]string)
	}
	for _, ic := range o.cfg.Interceptors {
		ic.Publish(ctx, &env)
	}
	if len(env.Headers) == 0 {
		env.Headers = nil
	}
	return env
}

// errNextTwice is the error of a second call of an interceptor's next.
var errNextTwice = errors.New("outbox: an Interceptor's Deliver called next more than once; the handler was not called again")

// interceptDeliver wraps the handler call f of subscription sub with the
// interceptors, the first outermost. Callers skip it when there are none,
// so that an undecorated call allocates nothing more.
func (d *dispatcher) interceptDeliver(sub string, evs []Event, f func(context.Context) error) func(context.Context) error {
	ics := d.cfg.Interceptors
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], f
		f = func(ctx context.Context) error {
			var called atomic.Bool
			err := ic.Deliver(ctx, sub, evs, func(ctx context.Context) error {
				if called.Swap(true) {
					return errNextTwice
				}
				return next(ctx)
			})
			if err == nil && !called.Load() {
				return fmt.Errorf("outbox: Interceptor %T returned from Deliver without calling next: the handler did not run", ic)
			}
			return err
		}
	}
	return f
}
