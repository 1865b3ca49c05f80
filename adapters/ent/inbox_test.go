package entoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/inbox"
)

// The inbox with ent transactions (inbox.Config.Begin =
// entoutbox.Begin(client)): the handler writes with the *ent.Tx of
// entoutbox.TxFrom and publishes; the inbox row, the order and the event
// commit together, a redelivery is a duplicate, and a handler error rolls
// all three back.
func TestInboxWithEntTransactions(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name)
			d, _ := inbox.DialectNamed(name)
			ib, err := inbox.New(f.sx.DB, inbox.Config{Dialect: d, Table: strings.Trim(f.outbox, "`\""), Begin: entoutbox.Begin(f.client)})
			if err != nil {
				t.Fatal(err)
			}
			fail := errors.New("boom")
			handler := func(err error) inbox.Handler {
				return func(ctx context.Context, m inbox.Message) error {
					tx, ok := entoutbox.TxFrom[*testent.Tx](ctx)
					if !ok {
						t.Fatal("no ent transaction in the handler's context")
					}
					f.createOrder(ctx, tx, m.ID)
					f.publish(ctx, "order.received")
					return err
				}
			}
			res, err := ib.Handle(f.ctx, "orders", inbox.Message{ID: "m-1"}, handler(fail))
			if res != inbox.Failed || !errors.Is(err, fail) {
				t.Fatalf("failing handler: %v %v", res, err)
			}
			if cs, rows := f.customers(), f.rows(); len(cs) != 0 || len(rows) != 0 {
				t.Errorf("after a failed handler: orders %v, events %v", cs, rows)
			}
			for _, want := range []inbox.Result{inbox.Applied, inbox.Duplicate} {
				if res, err := ib.Handle(f.ctx, "orders", inbox.Message{ID: "m-1"}, handler(nil)); res != want {
					t.Fatalf("%v %v, want %v", res, err, want)
				}
			}
			if cs, rows := f.customers(), f.rows(); len(cs) != 1 || cs[0] != "m-1" || len(rows) != 1 || rows[0] != "order.received" {
				t.Errorf("after apply and redelivery: orders %v, events %v; want [m-1], [order.received]", cs, rows)
			}
		})
	}
}
