package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// PublishOnce refuses what it cannot make idempotent before writing
// anything: an envelope without an ID (a ValidationError naming the
// field), a store that cannot insert once (an error naming the
// interface), no transaction in the context.
func TestPublishOnceRefusesWhatItCannotDedupe(t *testing.T) {
	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tx := st.Begin(ctx)
	defer tx.Rollback()
	_, err = ob.PublishOnceTx(ctx, tx, outbox.Envelope{Type: "Changed", JSON: []byte(`{}`)})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "ID" {
		t.Errorf("PublishOnce without an ID: %v; want a ValidationError on ID", err)
	}
	if _, err := ob.PublishOnce(ctx, outbox.Envelope{ID: "a", Type: "Changed", JSON: []byte(`{}`)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Errorf("PublishOnce without a transaction: %v; want ErrNoTx", err)
	}
	plain, err := outbox.New(struct {
		driver.Store
		driver.DeliveryStore
	}{st, st}, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.PublishOnceTx(ctx, tx, outbox.Envelope{ID: "a", Type: "Changed", JSON: []byte(`{}`)}); err == nil || !strings.Contains(err.Error(), "driver.OnceInserter") {
		t.Errorf("PublishOnce on a store without InsertOnce: %v; want an error naming driver.OnceInserter", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s, err := st.Stats(ctx); err != nil || s.New != 0 {
		t.Errorf("%+v (%v) after refused publishes; want nothing written", s, err)
	}
}

// The package-level PublishOnce finds the outbox in the context and
// reports a second publish of an id as existed, once committed or within
// the same transaction.
func TestPublishOnceInTheRequestTransaction(t *testing.T) {
	st := outboxtest.NewStore()
	ob, err := outbox.New(st, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	env := outbox.Envelope{ID: "order-7-placed", Type: "Changed", JSON: []byte(`{}`)}
	for i, want := range []bool{false, true} {
		tx := st.Begin(context.Background())
		ctx := txctx.With(outbox.NewContext(context.Background(), ob), tx)
		existed, err := outbox.PublishOnce(ctx, env)
		if err != nil || existed != want {
			t.Fatalf("publish %d: existed %v, %v; want %v", i+1, existed, err, want)
		}
		if existed, err := outbox.PublishOnce(ctx, env); err != nil || !existed {
			t.Fatalf("publish %d again in its transaction: existed %v, %v; want true", i+1, existed, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := st.Stats(context.Background()); err != nil || s.New != 1 {
		t.Errorf("%+v (%v); want 1 event written", s, err)
	}
}
