package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Cases of driver.Scheduler (Envelope.NotBefore, Outbox.Scheduled,
// Outbox.Cancel), an optional interface: skipped for a store without it.

// A scheduled row is not claimed before its time, is listed with its due
// time (earliest first, in pages), NextDue says when the first falls
// due, and it can be cancelled once, before it is due; a due row cannot.
func testMethodSchedule(t *testing.T, e *env) {
	sc, ok := e.store.(driver.Scheduler)
	if !ok {
		t.Skip("storetest: the store does not implement driver.Scheduler")
	}
	ctx := context.Background()
	ids := e.insertScheduled(t, sc, 2*time.Hour, time.Hour, 0)
	later, sooner, now := ids[0], ids[1], ids[2]
	rows, err := e.store.Claim(ctx, driver.ClaimRequest{Owner: "me", Limit: 10, Lease: time.Minute, SkipRecent: -1})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != now {
		t.Errorf("Claim took %v; want only %s (the others are not due)", rowIDs(rows), now)
	}
	got, err := sc.Scheduled(ctx, time.Time{}, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != sooner || got[1].ID != later {
		t.Fatalf("Scheduled: %+v; want %s then %s", got, sooner, later)
	}
	if d := time.Until(got[0].Due); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("%s is due in %v; want an hour", sooner, d)
	}
	if rec := e.inspect(t, sooner); !rec.CreatedAt.Equal(got[0].Due) {
		t.Errorf("%s was created at %v; want its due time %v (its age counts from then)", sooner, rec.CreatedAt, got[0].Due)
	}
	checkNextDue(t, sc, time.Hour, "the sooner one's")
	if page, err := sc.Scheduled(ctx, got[0].Due, got[0].ID, 10); err != nil || len(page) != 1 || page[0].ID != later {
		t.Errorf("Scheduled after %s: %+v (%v); want %s", sooner, page, err, later)
	}
	e.checkCancel(t, sc, sooner, now)
	if left, err := sc.Scheduled(ctx, time.Time{}, "", 10); err != nil || len(left) != 1 || left[0].ID != later {
		t.Errorf("Scheduled after the cancel: %+v (%v); want %s", left, err, later)
	}
	checkNextDue(t, sc, 2*time.Hour, "the later one's, after the cancel")
	if _, err := sc.Cancel(ctx, later); err != nil {
		t.Fatal(err)
	}
	checkNextDue(t, sc, 0, "nothing scheduled")
}

// checkNextDue checks that NextDue says want (within a minute), or none
// for 0.
func checkNextDue(t *testing.T, sc driver.Scheduler, want time.Duration, what string) {
	t.Helper()
	wait, ok, err := sc.NextDue(context.Background())
	switch {
	case err != nil:
		t.Errorf("NextDue (%s): %v", what, err)
	case want == 0 && ok:
		t.Errorf("NextDue (%s): %v; want none", what, wait)
	case want != 0 && (!ok || wait < want-time.Minute || wait > want+time.Minute):
		t.Errorf("NextDue (%s): %v, %v; want about %v", what, wait, ok, want)
	}
}

// insertScheduled writes one free row per delay in one transaction, each
// with a delay scheduled, and returns their ids in order.
func (e *env) insertScheduled(t *testing.T, sc driver.Scheduler, delays ...time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(delays))
	for i, delay := range delays {
		ids[i] = outbox.NewID()
		r := driver.Row{ID: ids[i], Type: string(typeA), Payload: []byte(payload), PayloadJSON: true, OccurredAt: time.Now()}
		if err := e.store.Insert(ctx, tx, &r, "", 0); err != nil {
			t.Fatal(err)
		}
		if delay == 0 {
			continue
		}
		if err := sc.Schedule(ctx, tx, ids[i], delay); err != nil {
			t.Fatalf("Schedule %s: %v", ids[i], err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkCancel cancels pending, not due yet, once (then DONE; a second
// Cancel is false), and finds that taken, due and leased, and an unknown
// id cannot be.
func (e *env) checkCancel(t *testing.T, sc driver.Scheduler, pending, taken string) {
	t.Helper()
	ctx := context.Background()
	if ok, err := sc.Cancel(ctx, pending); err != nil || !ok {
		t.Fatalf("Cancel %s: %v, %v; want it cancelled", pending, ok, err)
	}
	if rec := e.inspect(t, pending); rec.Status != outbox.StatusDone {
		t.Errorf("a cancelled event is %v; want DONE", rec.Status)
	}
	if ok, err := sc.Cancel(ctx, pending); err != nil || ok {
		t.Errorf("Cancel %s again: %v, %v; want false", pending, ok, err)
	}
	if ok, err := sc.Cancel(ctx, taken); err != nil || ok {
		t.Errorf("Cancel of a due, leased event: %v, %v; want false", ok, err)
	}
	if _, err := sc.Cancel(ctx, outbox.NewID()); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("Cancel of an unknown id: %v; want ErrNotFound", err)
	}
}

func rowIDs(rows []driver.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}
