package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// panickingHandlerFrame panics depth calls deep, for a stack far longer
// than a log record should be.
//
//go:noinline
func panickingHandlerFrame(ev outbox.Event, depth int) error {
	if depth > 0 {
		return panickingHandlerFrame(ev, depth-1)
	}
	panic("boom in " + string(ev.Type))
}

// A handler that panics is logged at ERROR with its stack: trimmed (the
// panic site first, the recover machinery cut, bounded length) and
// without the event's payload.
func TestHandlerPanicIsLoggedWithItsStack(t *testing.T) {
	var logs syncBuffer
	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{StatsInterval: -1, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan struct{}, 1)
	ob.Handle("p", func(ctx context.Context, ev outbox.Event) error {
		defer func() {
			select {
			case called <- struct{}{}:
			default:
			}
		}()
		return panickingHandlerFrame(ev, 300)
	}, "T")
	ctx := context.Background()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	tx := st.Begin(ctx)
	const secret = "SECRET-PAYLOAD-4711"
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{"card":"` + secret + `"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	<-called
	if err := ob.Close(ctx); err != nil { // the failure is written and logged before Close returns
		t.Fatal(err)
	}
	var rec string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, `"handler panicked`) {
			rec = line
		}
	}
	if rec == "" {
		t.Fatalf("no record of the panic; logs:\n%s", logs.String())
	}
	if !strings.Contains(rec, `"level":"ERROR"`) || !strings.Contains(rec, `"stack":"`) {
		t.Fatalf("panic record %s; want level ERROR with a stack", rec)
	}
	if !strings.Contains(rec, "panickingHandlerFrame") {
		t.Fatalf("stack does not show the panicking function: %s", rec)
	}
	if strings.Contains(rec, "runtime/debug.Stack") || strings.Contains(rec, "outbox.safeCall") {
		t.Fatalf("stack not trimmed to the panic site: %s", rec)
	}
	if len(rec) > 8<<10 || !strings.Contains(rec, "more bytes") {
		t.Fatalf("panic record is %d bytes; want it bounded", len(rec))
	}
	if strings.Contains(logs.String(), secret) {
		t.Fatalf("the payload reached the logs:\n%s", logs.String())
	}
}
