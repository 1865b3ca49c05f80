package main

import (
	"context"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// retire counts without -yes, refuses a subscription registered within
// -idle, and with -yes drops what the subscription owed (its dead
// deliveries stay) and completes the events that waited only for it.
func TestRetireCommand(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate: %+v", r)
			}
			f.seed() // mailer: E3 retrying (its only undone delivery), E7 dead
			want := func(r result, code int, text string) {
				t.Helper()
				if r.code != code || !strings.Contains(r.stdout+r.stderr, text) {
					t.Errorf("exit %d, stdout %q, stderr %q; want exit %d and %q", r.code, r.stdout, r.stderr, code, text)
				}
			}
			want(f.run("retire", "mailer"), exitNothing, "would retire mailer (registered: yes): drop 0 pending and 1 retrying deliveries; 1 dead ones stay")
			want(f.run("retire", "mailer", "-yes"), 1, "still registered by a running instance")
			want(f.run("retire", "nobody", "-yes"), exitNothing, `no subscription "nobody"`)
			want(f.run("retire", "mailer", "-idle", "-1s"), exitUsage, "-idle must not be negative")
			want(f.run("retire", "mailer", "-yes", "-idle", "0s"), 0, "retired mailer: 1 deliveries dropped, 1 events completed; 1 dead deliveries stay")
			rec, err := f.s.Inspect(context.Background(), f.id("E3"))
			if err != nil || rec.Status != outbox.StatusDone {
				t.Errorf("E3 after retire: %v, %v; want DONE", rec.Status, err)
			}
			subs, err := f.s.Subscriptions(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range subs {
				if s.Name == "mailer" {
					t.Errorf("mailer is still registered")
				}
			}
			// Its dead delivery (E7) keeps it visible until purged, in
			// stats too.
			if r := f.run("stats"); !strings.Contains(r.stdout, "unregistered (outboxctl retire)") {
				t.Errorf("stats does not list the retired mailer, which still holds a dead delivery:\n%s", r.stdout)
			}
			want(f.run("retire", "mailer"), exitNothing, "would retire mailer (registered: no): drop 0 pending and 0 retrying deliveries; 1 dead")
		})
	}
}

// migrate up takes -allow-unsupported-server (sqlstore's
// AllowUnsupportedServer), for a server the store's check refuses.
func TestMigrateAllowUnsupportedServerFlag(t *testing.T) {
	f := newFixture(t, "sqlite")
	if r := f.run("migrate", "up", "-allow-unsupported-server"); r.code != 0 {
		t.Fatalf("migrate up -allow-unsupported-server: %+v", r)
	}
	if r := f.run("migrate", "up", "-h"); r.code != 0 || !strings.Contains(r.stdout, "-allow-unsupported-server") {
		t.Fatalf("migrate up -h does not list the flag: %+v", r)
	}
}
