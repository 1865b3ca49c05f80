package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// scheduled list shows the events not due yet, earliest first, with their
// due times; scheduled cancel takes one back (only with -yes), and says
// why it cannot for a due event, an ordered one, an unknown id.
func TestScheduledCommands(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate up: %+v", r)
			}
			ctx := context.Background()
			if _, err := f.s.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "ledger", Types: []string{"Posted"}, Order: 1}}); err != nil {
				t.Fatal(err)
			}
			// An instance that only publishes: it learns from the table
			// that Posted is ordered, and delivers nothing.
			ob, err := outbox.New(f.s, outbox.Config{DisableHotPath: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ob.Close(context.Background()) })
			publish := func(env outbox.Envelope) string {
				t.Helper()
				tx, err := outbox.BeginTx(ctx, f.db.DB, nil)
				if err != nil {
					t.Fatal(err)
				}
				id, err := ob.PublishTx(ctx, tx, env)
				if err != nil {
					tx.Rollback()
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				return id
			}
			later := publish(outbox.Envelope{Type: "Remind", AggregateType: "user", AggregateID: "7", JSON: []byte(`{}`), NotBefore: time.Now().Add(2 * time.Hour)})
			sooner := publish(outbox.Envelope{Type: "Remind", JSON: []byte(`{}`), NotBefore: time.Now().Add(time.Hour)})
			now := publish(outbox.Envelope{Type: "Remind", JSON: []byte(`{}`)})
			var list struct {
				Scheduled []scheduledJSON `json:"scheduled"`
			}
			r := f.run("scheduled", "list", "-json")
			if err := json.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil {
				t.Fatalf("scheduled list -json: %+v (%v)", r, err)
			}
			if len(list.Scheduled) != 2 || list.Scheduled[0].ID != sooner || list.Scheduled[1].ID != later {
				t.Fatalf("scheduled: %+v; want %s then %s", list.Scheduled, sooner, later)
			}
			if d := time.Until(list.Scheduled[0].Due); d < 59*time.Minute || d > 61*time.Minute {
				t.Errorf("%s due in %v; want an hour", sooner, d)
			}
			if r := f.run("scheduled", "list"); r.code != 0 || !strings.Contains(r.stdout, later) || !strings.Contains(r.stdout, "user/7") {
				t.Errorf("scheduled list: %+v; want a table naming %s and its aggregate", r, later)
			}
			if r := f.run("scheduled", "cancel", sooner); r.code != exitNothing || !strings.Contains(r.stdout, "add -yes") {
				t.Errorf("scheduled cancel without -yes: %+v; want exit %d and the hint", r, exitNothing)
			}
			if r := f.run("scheduled", "cancel", sooner, "-yes"); r.code != 0 || !strings.Contains(r.stdout, "cancelled 1 of 1") {
				t.Errorf("scheduled cancel -yes: %+v; want 1 cancelled", r)
			}
			if rec, err := f.s.Inspect(ctx, sooner); err != nil || rec.Status != outbox.StatusDone {
				t.Errorf("cancelled event: %v, %v; want DONE", rec.Status, err)
			}
			r = f.run("scheduled", "cancel", now, "nope", "-yes")
			if r.code != 0 || !strings.Contains(r.stdout, "cancelled 0 of 2") || !strings.Contains(r.stdout, "due already") || !strings.Contains(r.stdout, "no such event") {
				t.Errorf("scheduled cancel of a due event and an unknown id: %+v", r)
			}
			ordered := publish(outbox.Envelope{Type: "Posted", AggregateType: "account", AggregateID: "1", JSON: []byte(`{}`), NotBefore: time.Now().Add(time.Hour)})
			if r := f.run("scheduled", "cancel", ordered, "-yes"); !strings.Contains(r.stdout, "ordered") {
				t.Errorf("scheduled cancel of an ordered event: %+v; want it refused as ordered", r)
			}
			if r := f.run("scheduled", "list", "-json"); !strings.Contains(r.stdout, ordered) || strings.Contains(r.stdout, sooner) {
				t.Errorf("scheduled list after the cancel: %s; want %s listed, %s gone", r.stdout, ordered, sooner)
			}
		})
	}
}
