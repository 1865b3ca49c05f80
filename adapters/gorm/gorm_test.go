package gormoutbox_test

import (
	"errors"
	"slices"
	"testing"

	"gorm.io/gorm"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/outbox"
)

var errAbort = errors.New("abort")

// configs are the GORM set-ups the transaction tests run under.
var configs = []struct {
	name    string
	cfg     gorm.Config
	session bool // PrepareStmt on a session rather than on the db
}{
	{name: "plain"},
	{name: "PrepareStmt", cfg: gorm.Config{PrepareStmt: true}},
	{name: "SessionPrepareStmt", session: true},
	{name: "ConfigPlugins", cfg: gorm.Config{PrepareStmt: true, Plugins: map[string]gorm.Plugin{gormoutbox.PluginName: &gormoutbox.Plugin{}}}},
}

func each(t *testing.T, fn func(t *testing.T, f *fixture, db *gorm.DB)) {
	for _, name := range databases {
		for _, c := range configs {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				f := setup(t, name, c.cfg)
				db := f.gdb()
				if c.session {
					db = db.Session(&gorm.Session{PrepareStmt: true})
				}
				fn(t, f, db)
			})
		}
	}
}

func TestCommitDeliversOnce(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		committed := false
		err := db.Transaction(func(tx *gorm.DB) error {
			f.createOrder(tx, "ada")
			f.publish(tx, "placed")
			return gormoutbox.AfterCommit(tx, func() { committed = true })
		})
		if err != nil {
			t.Fatal(err)
		}
		if !committed {
			t.Fatal("the after-commit hook did not run by the time Transaction returned")
		}
		if got := f.rows(); !slices.Equal(got, []string{"placed"}) {
			t.Fatalf("outbox rows %v", got)
		}
		f.expect("placed")
	})
}

func TestBeginCommit(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		tx := db.Begin()
		if tx.Error != nil {
			t.Fatal(tx.Error)
		}
		defer tx.Rollback() // a failed test must not leave it open
		f.createOrder(tx, "ada")
		f.publish(tx, "placed")
		if err := tx.Commit().Error; err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback().Error; err == nil {
			t.Fatal("Rollback after Commit succeeded")
		}
		f.expect("placed")
	})
}

func TestRollbackLeavesNothing(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		rolledBack := 0
		err := db.Transaction(func(tx *gorm.DB) error {
			f.createOrder(tx, "ada")
			f.publish(tx, "placed")
			gormoutbox.AfterRollback(tx, func() { rolledBack++ })
			return errAbort
		})
		if !errors.Is(err, errAbort) {
			t.Fatalf("Transaction: %v", err)
		}
		// Begin / Rollback too.
		tx := db.Begin()
		defer tx.Rollback()
		f.publish(tx, "placed2")
		gormoutbox.AfterRollback(tx, func() { rolledBack++ })
		if err := tx.Rollback().Error; err != nil {
			t.Fatal(err)
		}
		if rolledBack != 2 {
			t.Fatalf("after-rollback hooks ran %d times, want 2", rolledBack)
		}
		if got := f.rows(); len(got) != 0 {
			t.Fatalf("outbox rows %v after rollback", got)
		}
		if got := f.customers(); len(got) != 0 {
			t.Fatalf("orders %v after rollback", got)
		}
		f.expect()
	})
}

func TestRolledBackSavepointIsNeverDelivered(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		var spRolledBack int
		err := db.Transaction(func(tx *gorm.DB) error {
			f.createOrder(tx, "outer")
			f.publish(tx, "A")
			err := tx.Transaction(func(tx2 *gorm.DB) error {
				f.createOrder(tx2, "rolled-back")
				f.publish(tx2, "B")
				gormoutbox.AfterRollback(tx2, func() { spRolledBack++ })
				// Committed inside a savepoint that then rolls back.
				if err := tx2.Transaction(func(tx3 *gorm.DB) error {
					f.publish(tx3, "B2")
					return nil
				}); err != nil {
					return err
				}
				return errAbort
			})
			if !errors.Is(err, errAbort) {
				t.Fatalf("nested Transaction: %v", err)
			}
			if err := tx.Transaction(func(tx2 *gorm.DB) error {
				f.createOrder(tx2, "nested")
				f.publish(tx2, "C")
				return nil
			}); err != nil {
				return err
			}
			// The savepoint API by hand.
			if err := tx.SavePoint("manual").Error; err != nil {
				return err
			}
			f.publish(tx, "D")
			if err := tx.RollbackTo("manual").Error; err != nil {
				return err
			}
			// A nested transaction that panics rolls its savepoint back.
			func() {
				defer func() { recover() }()
				tx.Transaction(func(tx2 *gorm.DB) error {
					f.publish(tx2, "E")
					panic("boom")
				})
			}()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if spRolledBack != 1 {
			t.Fatalf("after-rollback hook of the rolled-back savepoint ran %d times, want 1", spRolledBack)
		}
		if got, want := f.rows(), []string{"A", "C"}; !slices.Equal(got, want) {
			t.Fatalf("outbox rows %v, want %v", got, want)
		}
		if got, want := f.customers(), []string{"nested", "outer"}; !slices.Equal(got, want) {
			t.Fatalf("orders %v, want %v", got, want)
		}
		f.expect("A", "C")
	})
}

func TestRawSavepointStatements(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		err := db.Transaction(func(tx *gorm.DB) error {
			f.publish(tx, "A")
			if err := tx.Exec("SAVEPOINT raw1").Error; err != nil {
				return err
			}
			f.publish(tx, "B")
			if err := tx.Exec("ROLLBACK TO SAVEPOINT raw1").Error; err != nil {
				return err
			}
			if err := tx.Exec("RELEASE SAVEPOINT raw1").Error; err != nil {
				return err
			}
			f.publish(tx, "C")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		f.expect("A", "C")
	})
}

func TestPanicRollsBack(t *testing.T) {
	each(t, func(t *testing.T, f *fixture, db *gorm.DB) {
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Fatalf("recovered %v, want the handler's panic", v)
				}
			}()
			db.Transaction(func(tx *gorm.DB) error {
				f.createOrder(tx, "ada")
				f.publish(tx, "placed")
				panic("boom")
			})
		}()
		if got := f.rows(); len(got) != 0 {
			t.Fatalf("outbox rows %v after panic", got)
		}
		if got := f.customers(); len(got) != 0 {
			t.Fatalf("orders %v after panic", got)
		}
		f.expect()
	})
}

func TestPublishOutsideTransaction(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name, gorm.Config{})
			_, err := gormoutbox.Publish(f.gdb(), outbox.Envelope{Type: "x", JSON: []byte(`{}`)})
			if !errors.Is(err, outbox.ErrNoTx) || !errors.Is(err, gormoutbox.ErrNoTx) {
				t.Fatalf("Publish outside a transaction: %v, want ErrNoTx", err)
			}
			if err := gormoutbox.AfterCommit(f.gdb(), func() {}); !errors.Is(err, outbox.ErrNoTx) {
				t.Fatalf("AfterCommit outside a transaction: %v", err)
			}
			// outbox.Publish with a context that carries no transaction.
			if _, err := outbox.Publish(f.ctx, outbox.Envelope{Type: "x", JSON: []byte(`{}`)}); !errors.Is(err, outbox.ErrNoTx) {
				t.Fatalf("outbox.Publish: %v", err)
			}
			// A transaction that did not begin through the plugin.
			raw, err := gorm.Open(dialector(name, f.sqlDB), &gorm.Config{Logger: f.db.Logger})
			if err != nil {
				t.Fatal(err)
			}
			raw.Transaction(func(tx *gorm.DB) error {
				if _, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "x", JSON: []byte(`{}`)}); !errors.Is(err, gormoutbox.ErrNotInstalled) {
					t.Fatalf("Publish in a foreign transaction: %v, want ErrNotInstalled", err)
				}
				return nil
			})
			// No outbox in the context and no default.
			f.db.Transaction(func(tx *gorm.DB) error {
				if _, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "x", JSON: []byte(`{}`)}); !errors.Is(err, outbox.ErrNoOutbox) {
					t.Fatalf("Publish without an outbox: %v, want ErrNoOutbox", err)
				}
				return nil
			})
			f.expect()
		})
	}
}

func TestContextCarriesTheTransaction(t *testing.T) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			f := setup(t, name, gorm.Config{})
			err := f.gdb().Transaction(func(tx *gorm.DB) error {
				ctx := gormoutbox.Context(tx)
				if _, err := outbox.Publish(ctx, outbox.Envelope{Type: "A", JSON: []byte(`{}`)}); err != nil {
					return err
				}
				f.createOrder(gormoutbox.DB(ctx), "via-ctx")
				// The same context inside a savepoint that rolls back.
				tx.Transaction(func(tx2 *gorm.DB) error {
					outbox.Publish(ctx, outbox.Envelope{Type: "B", JSON: []byte(`{}`)})
					return errAbort
				})
				txc, err := gormoutbox.Wrap(tx)
				if err != nil {
					return err
				}
				_, err = f.ob.PublishTx(ctx, txc, outbox.Envelope{Type: "C", JSON: []byte(`{}`)})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := f.customers(); !slices.Equal(got, []string{"via-ctx"}) {
				t.Fatalf("orders %v", got)
			}
			f.expect("A", "C")
		})
	}
}

func TestPluginIsIdempotentAndKeepsDB(t *testing.T) {
	f := setup(t, "sqlite", gorm.Config{PrepareStmt: true})
	if err := (&gormoutbox.Plugin{}).Initialize(f.db); err != nil {
		t.Fatal(err)
	}
	sqlDB, err := f.db.DB()
	if err != nil || sqlDB != f.sqlDB {
		t.Fatalf("db.DB() = %v, %v; want the *sql.DB given to the dialector", sqlDB, err)
	}
	f.db.Transaction(func(tx *gorm.DB) error {
		if sqlDB, err := tx.DB(); err != nil || sqlDB != f.sqlDB {
			t.Fatalf("tx.DB() = %v, %v", sqlDB, err)
		}
		return nil
	})
	f.expect()
}
