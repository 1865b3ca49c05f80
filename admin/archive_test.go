package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The archive's API and page search the delivered events of a store in
// archive mode by id, type and aggregate, in id order and in pages, with
// when and by whom each was delivered and never a payload; the event's
// page and API find an archived event and say so.
func TestArchiveSearch(t *testing.T) {
	f := newFixtureWith(t, sqlstore.Options{ArchiveDelivered: true}, admin.Config{})
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, f.store.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, env := range []outbox.Envelope{
		{Type: "placed", AggregateType: "order", AggregateID: "1", JSON: []byte(`{"email":"ada@example.com"}`)},
		{Type: "shipped", AggregateType: "order", AggregateID: "1", JSON: []byte(`{}`)},
		{Type: "placed", AggregateType: "order", AggregateID: "2", JSON: []byte(`{}`)},
	} {
		id, err := f.ob.PublishTx(ctx, tx, env)
		if err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	f.waitFor("every event archived", func() bool {
		for _, id := range ids {
			if rec, err := f.ob.Inspect(ctx, id); err != nil || !rec.Archived() {
				return false
			}
		}
		return true
	})
	type page struct {
		Events []admin.ArchivedEvent
		Next   string
	}
	search := func(query string) page {
		t.Helper()
		var v page
		f.getJSON("/admin/api/archive"+query, &v)
		for _, e := range v.Events {
			if e.DeliveredBy == "" || e.DeliveredAt.IsZero() {
				t.Errorf("GET /admin/api/archive%s: %+v; want when and by whom it was delivered", query, e)
			}
		}
		return v
	}
	idsOf := func(v page) string {
		var s []string
		for _, e := range v.Events {
			s = append(s, e.ID)
		}
		return fmt.Sprint(s)
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", ids},
		{"?id=" + ids[1], ids[1:2]},
		{"?type=placed", []string{ids[0], ids[2]}},
		{"?aggregate=order/1", ids[:2]},
		{"?aggregate=order", ids},
		{"?type=placed&aggregate=order/2", ids[2:]},
		{"?type=none", nil},
	} {
		if got := idsOf(search(c.query)); got != fmt.Sprint(c.want) {
			t.Errorf("GET /admin/api/archive%s = %s; want %v", c.query, got, c.want)
		}
	}
	first := search("?limit=2")
	if idsOf(first) != fmt.Sprint(ids[:2]) || first.Next != ids[1] {
		t.Fatalf("a full page names the next: %+v", first)
	}
	if got := search("?limit=2&after=" + url.QueryEscape(first.Next)); idsOf(got) != fmt.Sprint(ids[2:]) || got.Next != "" {
		t.Errorf("the second page: %+v; want %s alone", got, ids[2])
	}
	if resp, _ := f.do(req{method: "GET", path: "/admin/api/archive?aggregate=/1"}); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("an aggregate id without its type: %d; want 400", resp.StatusCode)
	}
	if resp, body := f.do(req{method: "GET", path: "/admin/api/archive"}); strings.Contains(body, "ada@example.com") {
		t.Errorf("the archive's API shows a payload: %d %s", resp.StatusCode, body)
	}

	resp, body := f.do(req{method: "GET", path: "/admin/archive?type=shipped"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, ids[1]) || strings.Contains(body, ids[0]) || !strings.Contains(body, `id="archive-search"`) || !strings.Contains(body, `value="shipped"`) {
		t.Errorf("GET /admin/archive?type=shipped: %d; want the search form with the type, and the shipped event alone:\n%s", resp.StatusCode, body)
	}
	if resp, body := f.do(req{method: "GET", path: "/admin/archive?type=none"}); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="no-archived"`) {
		t.Errorf("GET /admin/archive?type=none: %d; want the empty row:\n%s", resp.StatusCode, body)
	}
	if _, body := f.do(req{method: "GET", path: "/admin/"}); !strings.Contains(body, `href="/admin/archive"`) {
		t.Errorf("the layout does not link the archive")
	}

	var ev admin.Event
	f.getJSON("/admin/api/events/"+ids[0], &ev)
	if ev.DeliveredAt == nil || ev.DeliveredBy == "" || ev.Status != "done" {
		t.Errorf("GET /admin/api/events/ID of an archived event: %+v; want it done, with when and by whom it was delivered", ev)
	}
	if resp, body := f.do(req{method: "GET", path: "/admin/events/" + ids[0]}); resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="archived"`) {
		t.Errorf("the event's page of an archived event: %d; want the archived line:\n%s", resp.StatusCode, body)
	}
}
