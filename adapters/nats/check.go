package natsoutbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/outbox"
)

// WindowPolicy is what Check does about a duplicate window that is shorter
// than a subscription's retry span.
type WindowPolicy int

const (
	// WindowWarn logs a warning and lets the subscription run.
	WindowWarn WindowPolicy = iota
	// WindowRefuse makes Check (and Subscribe) fail.
	WindowRefuse
	// WindowIgnore skips the comparison.
	WindowIgnore
)

// DefaultDuplicateWindow is JetStream's duplicate window for a stream
// that does not set one.
const DefaultDuplicateWindow = 2 * time.Minute

// RetrySpan returns how long after its first attempt an event may be
// published again by sub: for each failed attempt before the last, the
// call's timeout plus the longest wait the retry policy may choose
// (ExponentialBackoff: its Ceiling times 1.5, the top of its jitter;
// another policy: one call of Delay). Zero fields take cfg's values, then
// the outbox defaults, as the engine does. With the defaults (10 attempts,
// 10 s timeout, 200 ms–60 s backoff) it is about 4 minutes: longer than
// JetStream's default duplicate window of 2 minutes.
//
// Waits of the circuit breaker (outbox.Unavailable) are not counted: a
// broker outage longer than the window can let an event whose
// acknowledgement was lost be stored twice.
func RetrySpan(sub outbox.Subscription, cfg outbox.Config) time.Duration {
	attempts := cmp.Or(sub.MaxAttempts, cfg.MaxAttempts, outbox.DefaultMaxAttempts)
	timeout := cmp.Or(sub.Timeout, cfg.ListenerTimeout, outbox.DefaultListenerTimeout)
	timeout = max(timeout, 0) // negative: no timeout; nothing to add
	retry := sub.Retry
	if retry == nil {
		retry = cfg.Retry
	}
	if retry == nil {
		retry = outbox.ExponentialBackoff{Base: outbox.DefaultRetryBase, Max: outbox.DefaultRetryMax}
	}
	var span time.Duration
	for failures := 1; failures < attempts; failures++ {
		span += timeout
		switch b := retry.(type) {
		case outbox.ExponentialBackoff:
			span += b.Ceiling(failures) * 3 / 2
		case *outbox.ExponentialBackoff:
			span += b.Ceiling(failures) * 3 / 2
		default:
			span += retry.Delay(failures)
		}
	}
	return span
}

// WindowError is returned by Check, under WindowRefuse, when a stream's
// duplicate window is shorter than the subscription's retry span.
type WindowError struct {
	Stream       string        // the stream's name
	Window       time.Duration // its duplicate window
	RetrySpan    time.Duration // the subscription's RetrySpan
	Subscription string        // the subscription's name
}

// Error says what to change.
func (e *WindowError) Error() string {
	return fmt.Sprintf("natsoutbox: stream %q keeps message ids for duplicate detection for %v, but subscription %q may publish an event again up to %v after its first attempt: raise the stream's duplicate_window (Duplicates) to at least %v, or lower the subscription's MaxAttempts, Timeout or Retry",
		e.Stream, e.Window, e.Subscription, e.RetrySpan, (e.RetrySpan + time.Second - 1).Truncate(time.Second))
}

// Check compares the duplicate window of the stream the subscription
// publishes to (Config.Stream, or the stream of each of sub.Types' subjects)
// with the subscription's RetrySpan, and warns (WindowWarn) or returns a
// *WindowError (WindowRefuse) when it is shorter. cfg is the outbox's
// configuration (ob.Config()). It fails if the stream cannot be found.
func (p *Publisher) Check(ctx context.Context, sub outbox.Subscription, cfg outbox.Config) error {
	if p.cfg.ShortWindow == WindowIgnore {
		return nil
	}
	names, err := p.streams(ctx, sub)
	if err != nil {
		return err
	}
	span := RetrySpan(sub, cfg)
	var errs []error
	for _, name := range names {
		s, err := p.js.Stream(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("natsoutbox: Check: stream %q: %w", name, err))
			continue
		}
		window := s.CachedInfo().Config.Duplicates
		if window == 0 {
			window = DefaultDuplicateWindow
		}
		if window >= span {
			continue
		}
		werr := &WindowError{Stream: name, Window: window, RetrySpan: span, Subscription: sub.Name}
		if p.cfg.ShortWindow == WindowRefuse {
			errs = append(errs, werr)
			continue
		}
		p.log.Warn("NATS duplicate window shorter than the retry span: a retried event may be stored twice",
			slog.String("stream", name), slog.Duration("duplicate_window", window),
			slog.String("subscription", sub.Name), slog.Duration("retry_span", span))
	}
	return errors.Join(errs...)
}

// streams returns the names of the streams sub publishes to: Config.Stream,
// or every stream whose subjects overlap the subjects of sub's types (all
// of the template's subjects when sub takes every type).
func (p *Publisher) streams(ctx context.Context, sub outbox.Subscription) ([]string, error) {
	if p.cfg.Stream != "" {
		return []string{p.cfg.Stream}, nil
	}
	var filters []string
	if len(sub.Types) == 0 {
		filters = append(filters, p.tmpl.filter(""))
	}
	for _, t := range sub.Types {
		filters = append(filters, p.tmpl.filter(t))
	}
	var names []string
	for _, f := range filters {
		found := false
		l := p.js.StreamNames(ctx, jetstream.WithStreamListSubject(f))
		for name := range l.Name() {
			found = true
			if !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
		if err := l.Err(); err != nil {
			return nil, fmt.Errorf("natsoutbox: Check: find the streams of subject %q: %w", f, err)
		}
		if !found {
			return nil, fmt.Errorf("natsoutbox: Check: no stream takes subject %q (subscription %q): create one, or set Config.Stream", f, sub.Name)
		}
	}
	return names, nil
}
