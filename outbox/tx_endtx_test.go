package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
)

// EndTx's contract, the same for every transaction of the module: a
// successful commit runs the after-commit hooks; a failed commit and any
// rollback run the after-rollback hooks; the end's error is returned, a
// hook's panic is logged with the context's logger and never returned;
// hooks run once.
func TestEndTx(t *testing.T) {
	var logs bytes.Buffer
	ctx := outbox.ContextWithLogger(context.Background(), slog.New(slog.NewTextHandler(&logs, nil)))
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
			var h outbox.Hooks
			var ran []string
			h.AfterCommit(func() {
				if tc.panicked {
					panic("boom")
				}
				ran = append(ran, "commit")
			})
			h.AfterRollback(func() { ran = append(ran, "rollback") })
			err := outbox.EndTx(ctx, func() error { return tc.endErr }, tc.commit, &h)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, tc.endErr)) {
				t.Fatalf("EndTx = %v; want the end's error only", err)
			}
			if !tc.panicked && strings.Join(ran, ",") != tc.want {
				t.Fatalf("hooks ran %v; want %s", ran, tc.want)
			}
			if tc.panicked != strings.Contains(logs.String(), "after-commit hook panicked") {
				t.Fatalf("log %q", logs.String())
			}
			before := len(ran)
			outbox.EndTx(ctx, func() error { return nil }, false, &h)
			if len(ran) != before {
				t.Fatal("hooks ran twice")
			}
		})
	}
}
