package gormoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/inbox"
)

// The inbox with GORM transactions (inbox.Config.Begin): the handler
// writes with gormoutbox.DB(ctx) and publishes with gormoutbox.Publish;
// the inbox row, the order and the event commit together, a redelivery is
// a duplicate, and a handler error rolls all three back.
func TestInboxWithGORMTransactions(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name, gorm.Config{})
			d, _ := inbox.DialectNamed(name)
			ib, err := inbox.New(f.sqlDB, inbox.Config{Dialect: d, Table: strings.Trim(f.outbox, "`\""), Begin: gormoutbox.Begin(f.db)})
			if err != nil {
				t.Fatal(err)
			}
			fail := errors.New("boom")
			handler := func(err error) inbox.Handler {
				return func(ctx context.Context, m inbox.Message) error {
					tx := gormoutbox.DB(ctx)
					f.createOrder(tx, m.ID)
					f.publish(tx, "order.received")
					return err
				}
			}
			res, err := ib.Handle(f.ctx, "orders", inbox.Message{ID: "m-1"}, handler(fail))
			if res != inbox.Failed || !errors.Is(err, fail) {
				t.Fatalf("failing handler: %v %v", res, err)
			}
			if n := f.orderCount(); n != 0 || len(f.rows()) != 0 {
				t.Errorf("after a failed handler: %d orders, events %v", n, f.rows())
			}
			for _, want := range []inbox.Result{inbox.Applied, inbox.Duplicate} {
				if res, err := ib.Handle(f.ctx, "orders", inbox.Message{ID: "m-1"}, handler(nil)); res != want {
					t.Fatalf("%v %v, want %v", res, err, want)
				}
			}
			if n, rows := f.orderCount(), f.rows(); n != 1 || len(rows) != 1 || rows[0] != "order.received" {
				t.Errorf("after apply and redelivery: %d orders, events %v; want 1, [order.received]", n, rows)
			}
		})
	}
}

func (f *fixture) orderCount() int64 {
	f.t.Helper()
	var n int64
	if err := f.db.Table(f.orders).Count(&n).Error; err != nil {
		f.t.Fatal(err)
	}
	return n
}
