package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

const OrderPlaced outbox.EventType = "OrderPlaced"

// placeOrder is business code: it publishes through the transaction in
// ctx, as it would behind txmw.Transactional.
func placeOrder(ctx context.Context, id int, fail bool) error {
	if _, err := outbox.Publish(ctx, outbox.Envelope{Type: OrderPlaced, JSON: fmt.Appendf(nil, `{"order":%d}`, id)}); err != nil {
		return err
	}
	if fail {
		return errors.New("payment declined")
	}
	return nil
}

// inTx runs f in a transaction of st, with ob in its context, committing
// on success and rolling back on error, as request middleware does.
func inTx(ctx context.Context, st *outboxtest.Store, ob *outbox.Outbox, f func(ctx context.Context) error) error {
	tx := st.Begin(ctx)
	if err := f(txctx.With(outbox.NewContext(ctx, ob), tx)); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

func newOutbox(st *outboxtest.Store, cfg outbox.Config) *outbox.Outbox {
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob, err := outbox.New(st, cfg)
	if err != nil {
		panic(err)
	}
	return ob
}

// A test of business code: what a committed request published is
// delivered, what a rolled-back one published is not.
func Example() {
	ctx := context.Background()
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{})
	rec := outboxtest.Record(ob, "test", OrderPlaced)
	if err := ob.Start(ctx); err != nil {
		panic(err)
	}
	defer ob.Close(ctx)

	err := inTx(ctx, st, ob, func(ctx context.Context) error { return placeOrder(ctx, 42, false) })
	fmt.Println("committed:", err)
	err = inTx(ctx, st, ob, func(ctx context.Context) error { return placeOrder(ctx, 43, true) })
	fmt.Println("rolled back:", err)

	if err := st.Drain(ctx, ob); err != nil {
		panic(err)
	}
	for _, ev := range rec.Events() {
		fmt.Println("delivered:", ev.Type, string(ev.JSON))
	}
	stats, _ := st.Stats(ctx)
	fmt.Println("done:", stats.Done, "pending:", stats.Pending())
	// Output:
	// committed: <nil>
	// rolled back: payment declined
	// delivered: OrderPlaced {"order":42}
	// done: 1 pending: 0
}

// A rolled-back transaction publishes nothing and runs only its
// after-rollback hooks.
func ExampleTx_Rollback() {
	ctx := context.Background()
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{})
	rec := outboxtest.Record(ob, "test")
	if err := ob.Start(ctx); err != nil {
		panic(err)
	}
	defer ob.Close(ctx)

	tx := st.Begin(ctx)
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"order":7}`)}); err != nil {
		panic(err)
	}
	tx.AfterRollback(func() { fmt.Println("after rollback") })
	tx.AfterCommit(func() { fmt.Println("after commit") })
	if err := tx.Rollback(); err != nil {
		panic(err)
	}
	if err := st.Drain(ctx, ob); err != nil {
		panic(err)
	}
	stats, _ := st.Stats(ctx)
	fmt.Println("delivered:", rec.Len(), "stored:", stats.New+stats.Done)
	// Output:
	// after rollback
	// delivered: 0 stored: 0
}

// A handler failing on demand: the first attempt fails, the retry
// succeeds.
func ExampleFailing() {
	ctx := context.Background()
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{
		Retry: outbox.RetryFunc(func(int) time.Duration { return 0 }), // retry at once, so that Drain sees it due
	})
	rec := outboxtest.NewRecorder()
	h := outboxtest.Failing(rec.Handle)
	ob.Handle("webhook", h.Handle, OrderPlaced)
	if err := ob.Start(ctx); err != nil {
		panic(err)
	}
	defer ob.Close(ctx)

	h.FailNext(1, nil)
	tx := st.Begin(ctx)
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{"order":1}`)})
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	if err := st.Drain(ctx, ob); err != nil {
		panic(err)
	}
	rec0 := rec.Events()[0]
	fmt.Println("calls:", h.Calls(), "delivered at attempt", rec0.Attempt)
	r, _ := st.Inspect(ctx, id)
	fmt.Println("status:", r.Status, "failed attempts:", r.Deliveries[0].Attempts)
	// Output:
	// calls: 2 delivered at attempt 2
	// status: done failed attempts: 1
}
