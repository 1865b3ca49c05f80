package entoutbox_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
	"github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

var errAbort = errors.New("abort")

func each(t *testing.T, fn func(t *testing.T, f *fixture)) {
	for _, name := range databases {
		t.Run(name, func(t *testing.T) { fn(t, setup(t, name)) })
	}
}

func TestCommitDeliversOnce(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		tx := f.begin()
		ctx := entoutbox.Bind(f.ctx, tx)
		if again := entoutbox.Bind(ctx, tx); again != ctx {
			t.Fatal("Bind of the same transaction made a new context")
		}
		if got := entoutbox.Tx[*testent.Tx](ctx); got != tx {
			t.Fatal("Tx did not return the bound transaction")
		}
		f.createOrder(ctx, tx, "ada")
		f.publish(ctx, "placed")
		committed := false
		outbox.AfterCommit(ctx, func() { committed = true })
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if !committed {
			t.Fatal("the after-commit hook did not run by the time Commit returned")
		}
		if err := tx.Rollback(); err == nil {
			t.Fatal("Rollback after Commit succeeded")
		}
		if got := f.rows(); !slices.Equal(got, []string{"placed"}) {
			t.Fatalf("outbox rows %v", got)
		}
		f.expect("placed")
	})
}

func TestWrapAndPublishTx(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		tx := f.begin()
		txc := entoutbox.Wrap(tx)
		if _, err := f.ob.PublishTx(f.ctx, txc, outbox.Envelope{Type: "placed", JSON: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		f.expect("placed")
	})
}

func TestRollbackLeavesNothing(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		tx := f.begin()
		ctx := entoutbox.Bind(f.ctx, tx)
		f.createOrder(ctx, tx, "ada")
		f.publish(ctx, "placed")
		rolledBack := 0
		outbox.AfterRollback(ctx, func() { rolledBack++ })
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if rolledBack != 1 {
			t.Fatalf("after-rollback hook ran %d times, want 1", rolledBack)
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

// withTx is the helper ent's documentation recommends, as users write it.
func withTx(ctx context.Context, client *testent.Client, fn func(ctx context.Context, tx *testent.Tx) error) (err error) {
	tx, err := client.Tx(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if v := recover(); v != nil {
			tx.Rollback()
			panic(v)
		}
	}()
	if err := fn(entoutbox.Bind(ctx, tx), tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

func TestPanicRollsBack(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		rolledBack := false
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Fatalf("recovered %v, want the panic", v)
				}
			}()
			withTx(f.ctx, f.client, func(ctx context.Context, tx *testent.Tx) error {
				f.createOrder(ctx, tx, "ada")
				f.publish(ctx, "placed")
				outbox.AfterRollback(ctx, func() { rolledBack = true })
				panic("boom")
			})
		}()
		if !rolledBack {
			t.Fatal("the after-rollback hook did not run")
		}
		if got := f.rows(); len(got) != 0 {
			t.Fatalf("outbox rows %v after panic", got)
		}
		if got := f.customers(); len(got) != 0 {
			t.Fatalf("orders %v after panic", got)
		}
		f.expect()
	})
}

func TestRolledBackSavepointIsNeverDelivered(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		spRolledBack := 0
		err := withTx(f.ctx, f.client, func(ctx context.Context, tx *testent.Tx) error {
			f.createOrder(ctx, tx, "outer")
			f.publish(ctx, "A")
			err := entoutbox.Savepoint(ctx, func(ctx context.Context) error {
				f.createOrder(ctx, tx, "rolled-back")
				f.publish(ctx, "B")
				outbox.AfterRollback(ctx, func() { spRolledBack++ })
				// Released inside a savepoint that then rolls back.
				if err := entoutbox.Savepoint(ctx, func(ctx context.Context) error {
					f.publish(ctx, "B2")
					return nil
				}); err != nil {
					return err
				}
				return errAbort
			})
			if !errors.Is(err, errAbort) {
				t.Fatalf("Savepoint: %v", err)
			}
			if err := entoutbox.Savepoint(ctx, func(ctx context.Context) error {
				f.createOrder(ctx, tx, "nested")
				f.publish(ctx, "C")
				return nil
			}); err != nil {
				return err
			}
			// Savepoint statements by hand, through the txctx.Tx.
			txc, _ := txctx.From(ctx)
			if _, err := txc.ExecContext(ctx, "SAVEPOINT manual"); err != nil {
				return err
			}
			f.publish(ctx, "D")
			if _, err := txc.ExecContext(ctx, "ROLLBACK TO SAVEPOINT manual"); err != nil {
				return err
			}
			// A panic inside a savepoint rolls it back.
			func() {
				defer func() { recover() }()
				entoutbox.Savepoint(ctx, func(ctx context.Context) error {
					f.publish(ctx, "E")
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

func TestOutsideTransaction(t *testing.T) {
	each(t, func(t *testing.T, f *fixture) {
		if _, err := outbox.Publish(f.ctx, outbox.Envelope{Type: "x", JSON: []byte(`{}`)}); !errors.Is(err, outbox.ErrNoTx) {
			t.Fatalf("Publish: %v, want outbox.ErrNoTx", err)
		}
		if err := entoutbox.Savepoint(f.ctx, func(context.Context) error { return nil }); !errors.Is(err, outbox.ErrNoTx) {
			t.Fatalf("Savepoint: %v, want outbox.ErrNoTx", err)
		}
		if err := outbox.AfterCommit(f.ctx, func() {}); !errors.Is(err, outbox.ErrNoTx) {
			t.Fatalf("AfterCommit: %v, want outbox.ErrNoTx", err)
		}
		if _, ok := entoutbox.TxFrom[*testent.Tx](f.ctx); ok {
			t.Fatal("TxFrom found a transaction")
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("Tx without a transaction did not panic")
				}
			}()
			entoutbox.Tx[*testent.Tx](f.ctx)
		}()
		f.expect()
	})
}
