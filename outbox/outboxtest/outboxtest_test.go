package outboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// outboxtest depends on the standard library and outbox only.
func TestImportsOnlyStdlibAndOutbox(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/txoutbox/txoutbox/outbox/outboxtest", "github.com/txoutbox/txoutbox/outbox", "github.com/txoutbox/txoutbox/outbox/driver", "github.com/txoutbox/txoutbox/outbox/txctx", "github.com/oklog/ulid/v2":
		default:
			t.Errorf("outboxtest imports %s: only the standard library, outbox and outbox/driver are allowed", p)
		}
	}
}

func started(t *testing.T, st *outboxtest.Store, cfg outbox.Config, setup func(ob *outbox.Outbox)) *outbox.Outbox {
	t.Helper()
	ob := newOutbox(st, cfg)
	setup(ob)
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ob.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return ob
}

func TestTx(t *testing.T) {
	ctx := context.Background()
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{})
	env := outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{}`)}

	if _, err := ob.Publish(txctx.With(ctx, &fakeTx{}), env); err == nil || !strings.Contains(err.Error(), "Store.Begin") {
		t.Fatalf("publish through a foreign transaction: %v; want an error naming Store.Begin", err)
	}
	if _, err := ob.PublishTx(ctx, outboxtest.NewStore().Begin(ctx), env); err == nil || !strings.Contains(err.Error(), "another Store") {
		t.Fatalf("publish through another store's transaction: %v", err)
	}
	tx := st.Begin(ctx)
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders VALUES (1)"); !errors.Is(err, outboxtest.ErrNoSQL) {
		t.Fatalf("ExecContext: %v; want ErrNoSQL", err)
	}
	id, err := ob.PublishTx(ctx, tx, env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Inspect(ctx, id); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("an uncommitted event is visible: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Inspect(ctx, id); err != nil || r.Status != outbox.StatusNew {
		t.Fatalf("after commit: %+v, %v", r, err)
	}
	if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("second Commit: %v", err)
	}
	if err := tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("Rollback after Commit: %v", err)
	}
	if _, err := ob.PublishTx(ctx, tx, env); !errors.Is(err, sql.ErrTxDone) {
		t.Fatalf("publish after Commit: %v", err)
	}

	// The same id in two transactions: the second commit fails and runs
	// the after-rollback hooks.
	a, b := st.Begin(ctx), st.Begin(ctx)
	dup := outbox.Envelope{ID: "dup", Type: OrderPlaced, JSON: []byte(`{}`)}
	for _, tx := range []*outboxtest.Tx{a, b} {
		if _, err := ob.PublishTx(ctx, tx, dup); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Commit(); err != nil {
		t.Fatal(err)
	}
	rolledBack := false
	b.AfterRollback(func() { rolledBack = true })
	if err := b.Commit(); err == nil || !rolledBack {
		t.Fatalf("commit of a duplicate id: %v, after-rollback hooks run: %v", err, rolledBack)
	}
}

type fakeTx struct{ txctx.Hooks }

func (*fakeTx) ExecContext(context.Context, string, ...any) (sql.Result, error) { return nil, nil }

// Drain returns with a paused subscription's deliveries waiting and a
// retry scheduled for later, and delivers the retry once it is due.
// It runs in a synctest bubble: the store's clock and the engine's timers
// follow the bubble's fake time.
func TestDrainLeavesWhatIsNotDue(t *testing.T) {
	synctest.Test(t, testDrainLeavesWhatIsNotDue)
}

func testDrainLeavesWhatIsNotDue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := outboxtest.NewStore()
	var rec, paused *outboxtest.Recorder
	h := outboxtest.Failing(nil)
	ob := started(t, st, outbox.Config{Retry: outbox.RetryFunc(func(int) time.Duration { return 50 * time.Millisecond })}, func(ob *outbox.Outbox) {
		rec = outboxtest.Record(ob, "rec")
		paused = outboxtest.Record(ob, "paused")
		ob.Handle("flaky", h.Handle)
	})
	if err := ob.Pause(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	h.FailNext(1, nil)
	tx := st.Begin(ctx)
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := st.Drain(ctx, ob); err != nil {
		t.Fatal(err)
	}
	if rec.Len() != 1 || paused.Len() != 0 || h.Calls() != 1 {
		t.Fatalf("after the first drain: rec %d, paused %d, flaky calls %d; want 1, 0, 1", rec.Len(), paused.Len(), h.Calls())
	}
	if _, err := rec.WaitFor(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the retry falls due (fake time)
	if err := st.Drain(ctx, ob); err != nil {
		t.Fatal(err)
	}
	if h.Calls() != 2 || paused.Len() != 0 {
		t.Fatalf("after the retry: flaky calls %d, paused %d; want 2, 0", h.Calls(), paused.Len())
	}
	if err := ob.Resume(ctx, "paused"); err != nil {
		t.Fatal(err)
	}
	if err := st.Drain(ctx, ob); err != nil {
		t.Fatal(err)
	}
	if paused.Len() != 1 {
		t.Fatalf("after resume: paused got %d, want 1", paused.Len())
	}
	r, err := st.Inspect(ctx, id)
	if err != nil || r.Status != outbox.StatusDone {
		t.Fatalf("event %+v, %v; want done", r, err)
	}
}

// Drain gives up with ctx when the outbox is not started.
func TestDrainNotStarted(t *testing.T) { synctest.Test(t, testDrainNotStarted) }

func testDrainNotStarted(t *testing.T) {
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{})
	outboxtest.Record(ob, "rec")
	tx := st.Begin(context.Background())
	if _, err := ob.PublishTx(context.Background(), tx, outbox.Envelope{Type: OrderPlaced, JSON: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	tx.Commit()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := st.Drain(ctx, ob); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drain: %v; want the deadline", err)
	}
	ob.Close(context.Background())
}

func TestRecorderWaitFor(t *testing.T) {
	rec := outboxtest.NewRecorder()
	go func() {
		for i := range 3 {
			rec.Handle(context.Background(), outbox.Event{Envelope: outbox.Envelope{ID: string(rune('a' + i)), Type: OrderPlaced}})
		}
	}()
	evs, err := rec.WaitFor(context.Background(), 3)
	if err != nil || len(evs) != 3 || strings.Join(rec.IDs(), "") != "abc" {
		t.Fatalf("WaitFor: %d events, %v, ids %v", len(evs), err, rec.IDs())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rec.WaitFor(ctx, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitFor beyond: %v", err)
	}
	rec.Reset()
	if rec.Len() != 0 {
		t.Fatal("Reset kept events")
	}
}

func TestFailingUnavailable(t *testing.T) {
	h := outboxtest.Failing(nil)
	h.UnavailableRetryAfter(true, time.Minute)
	err := h.Handle(context.Background(), outbox.Event{})
	if down, after := outbox.IsUnavailable(err); !down || after != time.Minute || !errors.Is(err, outboxtest.ErrDown) {
		t.Fatalf("down: %v (%v, %v)", err, down, after)
	}
	h.Unavailable(false)
	boom := errors.New("boom")
	h.FailNext(2, boom)
	for range 2 {
		if err := h.Handle(context.Background(), outbox.Event{}); !errors.Is(err, boom) {
			t.Fatalf("FailNext: %v", err)
		}
	}
	if err := h.Handle(context.Background(), outbox.Event{}); err != nil || h.Calls() != 4 || h.Failures() != 3 {
		t.Fatalf("after: %v, calls %d, failures %d", err, h.Calls(), h.Failures())
	}
}

// WithClock: leases run on the store's clock, so a test can expire one
// without waiting.
func TestWithClock(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := outboxtest.NewStore(outboxtest.WithClock(func() time.Time { return now }))
	tx := st.Begin(ctx)
	row := &driver.Row{ID: "e1", Type: string(OrderPlaced), Payload: []byte(`{}`), PayloadJSON: true, OccurredAt: now}
	if err := st.Insert(ctx, tx, row, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	req := driver.ClaimRequest{Owner: "b", Limit: 10, Lease: time.Minute}
	if rows, _ := st.Claim(ctx, req); len(rows) != 0 {
		t.Fatalf("claimed %d rows under a live lease", len(rows))
	}
	now = now.Add(time.Minute)
	rows, err := st.Claim(ctx, req)
	if err != nil || len(rows) != 1 || rows[0].PrevOwner != "a" || !rows[0].CreatedAt.Equal(now.Add(-time.Minute)) {
		t.Fatalf("after the lease: %+v, %v", rows, err)
	}
	if ok, _ := st.MarkRetry(ctx, "a", "e1", 0, "zombie"); ok {
		t.Fatal("the expired owner's write changed the row")
	}
	if n, _ := st.MarkDone(ctx, "b", []string{"e1"}, 0); n != 1 {
		t.Fatalf("MarkDone = %d", n)
	}
	if s, _ := st.Stats(ctx); s.Done != 1 || s.Pending() != 0 {
		t.Fatalf("stats %+v", s)
	}
}
