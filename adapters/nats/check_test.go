package natsoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

func TestRetrySpan(t *testing.T) {
	// The defaults: 9 waits of up to 1.5 × 200ms·2^(n−1) and 9 timeouts of 10s.
	if got, want := natsoutbox.RetrySpan(outbox.Subscription{}, outbox.Config{}), 90*time.Second+153300*time.Millisecond; got != want {
		t.Errorf("default span %v, want %v", got, want)
	}
	if got := natsoutbox.RetrySpan(outbox.Subscription{}, outbox.Config{}); got <= natsoutbox.DefaultDuplicateWindow {
		t.Errorf("default span %v is within JetStream's default window: the check would never fire", got)
	}
	sub := outbox.Subscription{MaxAttempts: 3, Timeout: time.Second, Retry: outbox.RetryFunc(func(int) time.Duration { return time.Second })}
	if got := natsoutbox.RetrySpan(sub, outbox.Config{MaxAttempts: 50}); got != 4*time.Second {
		t.Errorf("span %v, want 4s", got)
	}
	// The subscription's zero fields take the outbox's values.
	if got := natsoutbox.RetrySpan(outbox.Subscription{}, outbox.Config{MaxAttempts: 2, ListenerTimeout: -1, Retry: outbox.ExponentialBackoff{Base: time.Second}}); got != 1500*time.Millisecond {
		t.Errorf("span %v, want 1.5s", got)
	}
}

// Check finds the stream by the subscription's subjects and compares its
// duplicate window with the retry span: refuse, warn or pass.
func TestCheckDuplicateWindow(t *testing.T) {
	_, js := connect(t, testbroker.NATS(t))
	short := newStream(t, js, func(c *jetstream.StreamConfig) { c.Duplicates = 0 }) // JetStream's default: 2 min
	long := newStream(t, js, nil)                                                   // 10 min
	ctx := context.Background()
	cfg := outbox.Config{}
	sub := outbox.Subscription{Name: "to-nats"}

	refuse, err := natsoutbox.New(js, natsoutbox.Config{Subject: short.prefix + ".{type}", ShortWindow: natsoutbox.WindowRefuse})
	if err != nil {
		t.Fatal(err)
	}
	var werr *natsoutbox.WindowError
	if err := refuse.Check(ctx, sub, cfg); !errors.As(err, &werr) || werr.Stream != short.name || werr.Window != 2*time.Minute {
		t.Fatalf("short window, refuse: %v, want a *WindowError on %s", err, short.name)
	} else {
		t.Log(err)
	}
	// A subscription whose retries fit in the window passes.
	quick := outbox.Subscription{Name: "quick", Types: []outbox.EventType{"order.created"}, MaxAttempts: 3}
	if err := refuse.Check(ctx, quick, cfg); err != nil {
		t.Errorf("short retry span: %v", err)
	}

	var logs bytes.Buffer
	warn, _ := natsoutbox.New(js, natsoutbox.Config{Subject: short.prefix + ".{type}", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := warn.Check(ctx, sub, cfg); err != nil {
		t.Errorf("short window, warn: %v", err)
	}
	if !strings.Contains(logs.String(), "duplicate window shorter") || !strings.Contains(logs.String(), short.name) {
		t.Errorf("no warning logged: %q", logs.String())
	}

	ok, _ := natsoutbox.New(js, natsoutbox.Config{Subject: long.prefix + ".{type}", ShortWindow: natsoutbox.WindowRefuse})
	if err := ok.Check(ctx, sub, cfg); err != nil {
		t.Errorf("long window: %v", err)
	}
	named, _ := natsoutbox.New(js, natsoutbox.Config{Subject: "anything.{type}", Stream: long.name, ShortWindow: natsoutbox.WindowRefuse})
	if err := named.Check(ctx, sub, cfg); err != nil {
		t.Errorf("Config.Stream: %v", err)
	}

	none, _ := natsoutbox.New(js, natsoutbox.Config{Subject: "txo-nostream-" + strings.ToLower(outbox.NewID()) + ".{type}"})
	if err := none.Check(ctx, sub, cfg); err == nil || !strings.Contains(err.Error(), "no stream") {
		t.Errorf("no stream: %v", err)
	}

	// Subscribe runs the check.
	e := newOutbox(t, cfg)
	if err := refuse.Subscribe(ctx, e.ob, sub); !errors.As(err, &werr) {
		t.Errorf("Subscribe with a short window: %v", err)
	}
}
