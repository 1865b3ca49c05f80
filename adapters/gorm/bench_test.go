package gormoutbox_test

import (
	"context"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/outbox"
)

// BenchmarkTransaction measures one db.Transaction that inserts an order:
// without the plugin, with it, and with it plus one published event.
func BenchmarkTransaction(b *testing.B) {
	for _, name := range databases {
		b.Run(name, func(b *testing.B) {
			f := setupBench(b, name)
			raw, err := gorm.Open(dialector(name, f.sqlDB), &gorm.Config{Logger: logger.Discard, SkipDefaultTransaction: true})
			if err != nil {
				b.Fatal(err)
			}
			// The listeners are not what is measured: without the hot path
			// the benchmark's producer would only fill the dispatcher's queue.
			ob, err := outbox.New(f.store, outbox.Config{DisableHotPath: true, DisablePoller: true})
			if err != nil {
				b.Fatal(err)
			}
			db := f.db.WithContext(outbox.NewContext(context.Background(), ob))
			run := func(b *testing.B, db *gorm.DB, publish bool) {
				for b.Loop() {
					err := db.Transaction(func(tx *gorm.DB) error {
						if err := tx.Table(f.orders).Create(&Order{Customer: "ada", Total: 1}).Error; err != nil {
							return err
						}
						if publish {
							_, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "placed", JSON: []byte(`{"customer":"ada"}`)})
							return err
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("no-plugin", func(b *testing.B) { run(b, raw, false) })
			b.Run("plugin", func(b *testing.B) { run(b, db, false) })
			b.Run("plugin+publish", func(b *testing.B) { run(b, db, true) })
		})
	}
}
