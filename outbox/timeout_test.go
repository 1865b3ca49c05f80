package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// A handler that honours its context and returns its own verdict when the
// subscription's timeout ends (a connector whose broker did not answer in
// time says Unavailable) is judged by that verdict, not by the engine's
// timeout: no attempt is spent. A handler that ignores its context still
// times out and spends one.
func TestTimeoutPrefersHandlersVerdict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := outboxtest.NewStore()
		ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler), PollInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		polite := make(chan struct{}, 10)
		if err := ob.Subscribe(outbox.Subscription{
			Name: "polite", Types: []outbox.EventType{"T"}, Timeout: time.Second,
			Handler: func(ctx context.Context, ev outbox.Event) error {
				polite <- struct{}{}
				<-ctx.Done()
				return outbox.Unavailable(errors.New("broker did not ack in time"), 0)
			},
		}); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		if err := ob.Subscribe(outbox.Subscription{
			Name: "rude", Types: []outbox.EventType{"T"}, Timeout: time.Second,
			Handler: func(ctx context.Context, ev outbox.Event) error {
				<-release // ignores ctx
				return nil
			},
		}); err != nil {
			t.Fatal(err)
		}
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		tx := st.Begin(ctx)
		id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		<-polite
		time.Sleep(3 * time.Second) // past both timeouts (the calls run one after the other) and the grace
		synctest.Wait()
		close(release)
		rec, err := ob.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, d := range rec.Deliveries {
			got[d.Subscription] = d.Attempts
		}
		if got["polite"] != 0 {
			t.Errorf("polite handler's delivery spent %d attempts; want 0 (its Unavailable, not the timeout)", got["polite"])
		}
		if got["rude"] != 1 {
			t.Errorf("rude handler's delivery spent %d attempts; want 1 (timed out)", got["rude"])
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		ob.Close(cctx)
	})
}
