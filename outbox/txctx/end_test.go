package txctx_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// End's contract, the same for every transaction of the module: a
// successful commit runs the after-commit hooks; a failed commit and any
// rollback run the after-rollback hooks; the end's error is returned, a
// hook's panic is logged with the context's logger and never returned;
// hooks run once.
func TestEnd(t *testing.T) {
	var logs bytes.Buffer
	ctx := txctx.WithLogger(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
	for _, tc := range []struct {
		name     string
		commit   bool
		endErr   error
		want     string
		wantErr  bool
		panicked bool
	}{
		{"commit", true, nil, "commit", false, false},
		{"failed commit", true, errors.New("deadlock"), "rollback", true, false},
		{"rollback", false, nil, "rollback", false, false},
		{"hook panics", true, nil, "commit", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			var h txctx.Hooks
			var ran []string
			h.AfterCommit(func() {
				if tc.panicked {
					panic("boom")
				}
				ran = append(ran, "commit")
			})
			h.AfterRollback(func() { ran = append(ran, "rollback") })
			err := h.End(ctx, func() error { return tc.endErr }, tc.commit)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, tc.endErr)) {
				t.Fatalf("End = %v; want the end's error only", err)
			}
			if !tc.panicked && strings.Join(ran, ",") != tc.want {
				t.Fatalf("hooks ran %v; want %s", ran, tc.want)
			}
			if tc.panicked != strings.Contains(logs.String(), "after-commit hook panicked") {
				t.Fatalf("log %q", logs.String())
			}
			before := len(ran)
			h.End(ctx, func() error { return nil }, false)
			if len(ran) != before {
				t.Fatal("hooks ran twice")
			}
		})
	}
}

func TestHooks(t *testing.T) {
	var h txctx.Hooks
	var order []string
	h.AfterCommit(func() { order = append(order, "c1") })
	h.AfterRollback(func() { order = append(order, "r1") })
	h.AfterCommit(func() { panic("boom") })
	h.AfterCommit(func() { order = append(order, "c3") })
	err := h.Committed()
	var pe *txctx.PanicError
	if !errors.As(err, &pe) || pe.Index != 2 || pe.Value != "boom" {
		t.Fatalf("Committed: %v; want the panic of hook 2 (counting every hook in registration order)", err)
	}
	if !slices.Equal(order, []string{"c1", "c3"}) {
		t.Fatalf("ran %v; want c1, c3 (after-rollback hooks dropped, panic contained)", order)
	}
	if h.RolledBack() != nil || h.Committed() != nil || !h.Ended() {
		t.Fatal("a second outcome did something")
	}
	h.AfterCommit(func() { order = append(order, "late") })
	if len(order) != 2 {
		t.Fatal("hook registered after the outcome ran")
	}
	var r txctx.Hooks
	r.AfterCommit(func() { t.Fatal("after-commit hook ran on rollback") })
	ran := false
	r.AfterRollback(func() { ran = true })
	if err := r.RolledBack(); err != nil || !ran {
		t.Fatalf("RolledBack: %v, ran %v", err, ran)
	}
}
