package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// archive search finds the events an instance in archive mode delivered,
// by id, type and aggregate, with when and by whom; archive show prints
// one from the archive; archive cleanup deletes only what is older than
// -older, and only with -yes.
func TestArchiveCommands(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate up: %+v", r)
			}
			ctx := context.Background()
			st, err := sqlstore.New(f.db, sqlstore.Options{Table: f.table, ArchiveDelivered: true})
			if err != nil {
				t.Fatal(err)
			}
			delivered := make(chan string, 10)
			ob, err := outbox.New(st, outbox.Config{InstanceID: "worker-1", PollInterval: 20 * time.Millisecond, PollMaxInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ob.Handle("any", func(_ context.Context, ev outbox.Event) error { delivered <- ev.ID; return nil })
			if err := ob.Start(ctx); err != nil {
				t.Fatal(err)
			}
			tx, err := outbox.BeginTx(ctx, f.db.DB, nil)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, env := range []outbox.Envelope{
				{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "1", JSON: []byte(`{"secret":"pii"}`)},
				{Type: "OrderShipped", AggregateType: "Order", AggregateID: "1", JSON: []byte(`{}`)},
				{Type: "OrderPlaced", AggregateType: "Order", AggregateID: "2", JSON: []byte(`{}`)},
			} {
				id, err := ob.PublishTx(ctx, tx, env)
				if err != nil {
					tx.Rollback()
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			for range ids {
				select {
				case <-delivered:
				case <-time.After(30 * time.Second):
					t.Fatal("events not delivered in 30s")
				}
			}
			// Close waits for the completions: every event is archived.
			if err := ob.Close(ctx); err != nil {
				t.Fatal(err)
			}
			search := func(args ...string) []archivedJSON {
				t.Helper()
				r := f.run(append([]string{"archive", "search", "-json"}, args...)...)
				var out struct {
					Archived []archivedJSON `json:"archived"`
				}
				if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil {
					t.Fatalf("archive search %v: %+v (%v)", args, r, err)
				}
				return out.Archived
			}
			idsOf := func(es []archivedJSON) string {
				var s []string
				for _, e := range es {
					s = append(s, e.ID)
					if e.DeliveredBy != "worker-1" || e.DeliveredAt.IsZero() {
						t.Errorf("archived %+v; want delivered by worker-1 at a time", e)
					}
				}
				return fmt.Sprint(s)
			}
			for _, c := range []struct {
				args []string
				want []string
			}{
				{nil, ids},
				{[]string{"-id", ids[1]}, ids[1:2]},
				{[]string{"-type", "OrderPlaced"}, []string{ids[0], ids[2]}},
				{[]string{"-aggregate", "Order/1"}, ids[:2]},
				{[]string{"-aggregate", "Order"}, ids},
				{[]string{"-type", "OrderPlaced", "-aggregate", "Order/2"}, ids[2:]},
				{[]string{"-limit", "2", "-after", ids[0]}, ids[1:]},
				{[]string{"-type", "Nothing"}, nil},
			} {
				if got := idsOf(search(c.args...)); got != fmt.Sprint(c.want) {
					t.Errorf("archive search %v = %s; want %v", c.args, got, c.want)
				}
			}
			if r := f.run("archive", "search", "-type", "OrderShipped"); r.code != 0 || !strings.Contains(r.stdout, ids[1]) || !strings.Contains(r.stdout, "Order/1") || !strings.Contains(r.stdout, "worker-1") || strings.Contains(r.stdout, "pii") {
				t.Errorf("archive search -type OrderShipped: %+v; want a table naming the event, its aggregate and worker-1, and no payload", r)
			}
			if r := f.run("archive", "search", "-limit", "0"); r.code != exitUsage {
				t.Errorf("archive search -limit 0: %+v; want exit %d", r, exitUsage)
			}
			if r := f.run("archive", "show", ids[0]); r.code != 0 || !strings.Contains(r.stdout, "by worker-1") || strings.Contains(r.stdout, "pii") {
				t.Errorf("archive show: %+v; want the event, delivered by worker-1, without its payload", r)
			}
			if r := f.run("archive", "show", ids[0], "-payload"); r.code != 0 || !strings.Contains(r.stdout, "pii") {
				t.Errorf("archive show -payload: %+v; want the payload", r)
			}

			// Cleanup: one event delivered long ago.
			shift := map[string]string{"mysql": "delivered_at - INTERVAL 40 DAY", "postgres": "delivered_at - INTERVAL '40 days'", "sqlite": "delivered_at - 3456000000000"}[name]
			f.db.MustExec(f.db.Rebind(`UPDATE `+st.ArchiveTable()+` SET delivered_at = `+shift+` WHERE id = ?`), ids[0])
			if r := f.run("archive", "cleanup"); r.code != exitNothing || !strings.Contains(r.stdout, "add -yes") {
				t.Errorf("archive cleanup without -yes: %+v; want exit %d and the hint", r, exitNothing)
			}
			if got := idsOf(search()); got != fmt.Sprint(ids) {
				t.Errorf("after archive cleanup without -yes: %s; want all three kept", got)
			}
			if r := f.run("archive", "cleanup", "-yes", "-limit", "1"); r.code != 0 || !strings.Contains(r.stdout, "deleted 1 ") {
				t.Errorf("archive cleanup -yes: %+v; want 1 deleted", r)
			}
			if got := idsOf(search()); got != fmt.Sprint(ids[1:]) {
				t.Errorf("after archive cleanup: %s; want %v", got, ids[1:])
			}
		})
	}
}
