package outbox_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// errorSignal is a slog handler that counts ERROR records whose message
// contains match and signals the first.
type errorSignal struct {
	match string
	n     atomic.Int32
	first chan struct{}
}

func (h *errorSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *errorSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelError && strings.Contains(r.Message, h.match) && h.n.Add(1) == 1 {
		close(h.first)
	}
	return nil
}
func (h *errorSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorSignal) WithGroup(string) slog.Handler      { return h }

// A cancelled Start context stops delivery while Publish goes on: it is
// logged at ERROR once, and Health and ReadyHandler report it (issue 37,
// item 10). A cancellation after Close is not reported.
func TestCancelledStartContextIsReported(t *testing.T) {
	sig := &errorSignal{match: "context given to Start was cancelled", first: make(chan struct{})}
	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{StatsInterval: -1, Logger: slog.New(sig)})
	if err != nil {
		t.Fatal(err)
	}
	ob.Handle("h", func(context.Context, outbox.Event) error { return nil }, "T")
	ctx, cancel := context.WithCancel(context.Background())
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if h := ob.Health(context.Background()); !h.Live || !h.Ready {
		t.Fatalf("after Start: %+v", h)
	}
	cancel()
	select {
	case <-sig.first:
	case <-time.After(30 * time.Second): // a guard, not a timed assertion
		t.Fatal("the cancellation of Start's context was not logged at ERROR")
	}
	h := ob.Health(context.Background())
	if h.Live || h.Ready || !strings.Contains(check(h, "running").Detail, "context given to Start was cancelled") {
		t.Fatalf("after the cancellation: %+v; want neither live nor ready, and the running check saying why", h)
	}
	rec := httptest.NewRecorder()
	ob.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "context given to Start was cancelled") {
		t.Fatalf("ReadyHandler: %d %s", rec.Code, rec.Body)
	}
	ob.Health(context.Background()) // asking again logs nothing more
	if err := ob.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := sig.n.Load(); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}

	// Cancelled after Close: no news.
	sig2 := &errorSignal{match: "context given to Start was cancelled", first: make(chan struct{})}
	ob2, err := outbox.New(outboxtest.NewStore(), outbox.Config{StatsInterval: -1, Logger: slog.New(sig2)})
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	if err := ob2.Start(ctx2); err != nil {
		t.Fatal(err)
	}
	if err := ob2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel2()
	if n := sig2.n.Load(); n != 0 {
		t.Fatalf("a cancellation after Close was logged %d times", n)
	}
}
