package outbox_test

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// An instance with no subscription for an event's type hands the event
// back for NoListenerDelay each time it claims it (here an instance that
// only bills, beside one that ships). Idle instances back off to the same
// PollMaxInterval: if they polled in step, with the shipping instance's
// polls falling while the event is handed back and not yet due, the
// billing instance would claim it every time, for as long as both run.
// The back-off's jitter breaks the step, whatever the instances' phases.
func TestIdlePollersDoNotStayInStep(t *testing.T) {
	for offset := time.Duration(0); offset < 50*time.Millisecond; offset += 5 * time.Millisecond {
		t.Run(offset.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := outboxtest.NewStore()
				cfg := outbox.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: 10 * time.Millisecond,
					PollMaxInterval: 50 * time.Millisecond, NoListenerDelay: 20 * time.Millisecond, SkipRecent: -1}
				start := func(setup func(*outbox.Outbox)) {
					ob, err := outbox.New(st, cfg)
					if err != nil {
						t.Fatal(err)
					}
					setup(ob)
					if err := ob.Start(context.Background()); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						if err := ob.Close(context.Background()); err != nil {
							t.Errorf("Close: %v", err)
						}
					})
				}
				var old *outbox.Outbox
				start(func(ob *outbox.Outbox) {
					old = ob
					ob.Handle("billing", func(context.Context, outbox.Event) error { return nil }, "Invoiced")
				})
				settle(offset)
				got := make(chan string, 1)
				start(func(ob *outbox.Outbox) {
					ob.Handle("shipping", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil }, "Shipped")
				})
				settle(time.Second) // both idle, at their longest wait
				ctx := context.Background()
				tx := st.Begin(ctx)
				id, err := old.PublishTx(ctx, tx, outbox.Envelope{Type: "Shipped", JSON: []byte(`{}`)})
				if err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				settle(10 * time.Second)
				select {
				case d := <-got:
					if d != id {
						t.Fatalf("delivered %s, want %s", d, id)
					}
				default:
					rec, err := st.Inspect(ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					t.Fatalf("the new instance did not get the event in 10 s (status %v, attempts %d): the old one, which has no subscription for it, kept it", rec.Status, rec.Attempts)
				}
			})
		})
	}
}
