package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// The inbox commands on each database: list and show parked messages
// (the payload only with -payload), purge asks for -yes, and cleanup runs.
func TestInboxCommands(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, name)
			if r := f.run("migrate", "up"); r.code != 0 {
				t.Fatalf("migrate up: %+v", r)
			}
			if r := f.run("inbox", "list"); r.code != exitNothing || !strings.Contains(r.stderr, "no parked messages") {
				t.Errorf("list of an empty inbox: %+v", r)
			}
			d, _ := inbox.DialectNamed(name)
			ib, err := inbox.New(f.db.DB, inbox.Config{Dialect: d, Table: f.table, MaxAttempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"m-1", "m-2"} {
				res, _ := ib.Handle(context.Background(), "billing", inbox.Message{ID: id, Payload: []byte("secret " + id), Headers: map[string]string{"k": "v"}},
					func(context.Context, inbox.Message) error { return errors.New("cannot decode\nline two") })
				if res != inbox.Parked {
					t.Fatalf("%s: %v", id, res)
				}
			}
			r := f.run("inbox", "list")
			if r.code != 0 || !strings.Contains(spacesRE.ReplaceAllString(r.stdout, "  "), "billing  m-1") || !strings.Contains(r.stdout, "cannot decode line two") || strings.Contains(r.stdout, "secret") {
				t.Errorf("list: %+v", r)
			}
			var listed []parkedJSON
			if r := f.run("-json", "inbox", "list", "-consumer", "billing", "-limit", "1"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &listed) != nil ||
				len(listed) != 1 || listed[0].ID != "m-1" || listed[0].Payload != nil || listed[0].PayloadLen != 10 || listed[0].Headers["k"] != "v" {
				t.Errorf("list -json -limit 1: %+v (%v)", r, listed)
			}
			if r := f.run("inbox", "show", "billing", "m-2"); r.code != 0 || strings.Contains(r.stdout, "secret") || !strings.Contains(r.stdout, "header k") {
				t.Errorf("show: %+v", r)
			}
			if r := f.run("inbox", "show", "billing", "m-2", "-payload"); r.code != 0 || !strings.Contains(r.stdout, "secret m-2") {
				t.Errorf("show -payload: %+v", r)
			}
			if r := f.run("inbox", "show", "billing", "nope"); r.code != exitNothing {
				t.Errorf("show of an unknown message: %+v", r)
			}
			if r := f.run("inbox", "purge", "billing", "m-1", "nope"); r.code != exitNothing || !strings.Contains(r.stdout, "would purge 1") {
				t.Errorf("purge without -yes: %+v", r)
			}
			if r := f.run("inbox", "purge", "billing", "m-1", "-yes"); r.code != 0 || !strings.Contains(r.stdout, "purged 1") {
				t.Errorf("purge -yes: %+v", r)
			}
			if left, _ := ib.Parked(context.Background(), inbox.ParkedFilter{}); len(left) != 1 || left[0].Message.ID != "m-2" {
				t.Errorf("parked after purge: %+v", left)
			}
			if r := f.run("inbox", "cleanup"); r.code != 0 || !strings.Contains(r.stdout, "deleted 0 inbox rows") {
				t.Errorf("cleanup: %+v", r)
			}
			if r := f.run("inbox", "replay"); r.code != exitUsage || !strings.Contains(r.stderr, "want list, show, purge or cleanup") {
				t.Errorf("inbox replay: %+v", r)
			}
		})
	}
}
