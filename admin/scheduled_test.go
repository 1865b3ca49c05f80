package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/outbox"
)

// The scheduled events are listed earliest first, in pages, on the page
// and in the API; a cancel asks to confirm first, then marks the event
// done and writes the audit log; one due already is not cancelled, and
// says why.
func TestScheduledAndCancel(t *testing.T) {
	f := newFixture(t, admin.Config{})
	ctx := context.Background()
	publish := func(notBefore time.Time) string {
		t.Helper()
		tx, err := outbox.BeginTx(ctx, f.store.DB().DB, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		id, err := f.ob.PublishTx(ctx, tx, outbox.Envelope{Type: "remind", AggregateType: "user", AggregateID: "7", JSON: []byte(`{}`), NotBefore: notBefore})
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return id
	}
	later := publish(time.Now().Add(2 * time.Hour))
	sooner := publish(time.Now().Add(time.Hour))
	var v struct {
		Events []admin.ScheduledEvent
		Next   string
	}
	f.getJSON("/admin/api/scheduled", &v)
	if len(v.Events) != 2 || v.Events[0].ID != sooner || v.Events[1].ID != later || v.Next != "" {
		t.Fatalf("scheduled: %+v; want %s then %s", v, sooner, later)
	}
	f.getJSON("/admin/api/scheduled?limit=1", &v)
	if len(v.Events) != 1 || v.Next == "" {
		t.Fatalf("a full page names the next: %+v", v)
	}
	f.getJSON("/admin/api/scheduled?limit=1&after="+url.QueryEscape(v.Next), &v)
	if len(v.Events) != 1 || v.Events[0].ID != later {
		t.Fatalf("the second page: %+v; want %s", v, later)
	}
	if resp, _ := f.do(req{method: "GET", path: "/admin/api/scheduled?after=nonsense"}); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a bad cursor: %d; want 400", resp.StatusCode)
	}
	resp, body := f.do(req{method: "GET", path: "/admin/scheduled"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, sooner) || !strings.Contains(body, "user/7") || !strings.Contains(body, `name="csrf_token" value="`+f.token+`"`) {
		t.Fatalf("page: %d %s", resp.StatusCode, body)
	}
	// The page asks to confirm first, changing nothing.
	resp, body = f.post("/admin/scheduled/cancel", url.Values{"id": {sooner}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `name="confirm" value="1"`) || !strings.Contains(body, sooner) {
		t.Fatalf("cancel without confirm: %d %s", resp.StatusCode, body)
	}
	if rec, _ := f.ob.Inspect(ctx, sooner); rec.Status != outbox.StatusNew || len(f.audit.records("admin: audit")) != 0 {
		t.Fatal("the unconfirmed cancel changed something")
	}
	resp, _ = f.post("/admin/scheduled/cancel", url.Values{"id": {sooner}, "confirm": {"1"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "notice=Cancelled") {
		t.Fatalf("confirmed cancel: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if rec, _ := f.ob.Inspect(ctx, sooner); rec.Status != outbox.StatusDone {
		t.Errorf("the cancelled event is %v; want DONE", rec.Status)
	}
	if recs := f.audit.records("admin: audit"); len(recs) != 1 || recs[0]["action"] != "cancel" || recs[0]["id"] != sooner {
		t.Errorf("audit: %v; want one cancel of %s", recs, sooner)
	}
	// Through the API: an event due already is not cancelled, and says why.
	now := f.publish("good")
	var c struct {
		Cancelled bool
		Why       string
	}
	resp, body = f.post("/admin/api/scheduled/cancel", url.Values{"id": {now}})
	if err := json.Unmarshal([]byte(body), &c); resp.StatusCode != http.StatusOK || err != nil || c.Cancelled || !strings.Contains(c.Why, "due already") {
		t.Errorf("cancel of a due event: %d %s", resp.StatusCode, body)
	}
	if resp, _ := f.post("/admin/api/scheduled/cancel", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("cancel without id: %d; want 400", resp.StatusCode)
	}
	f.getJSON("/admin/api/scheduled", &v)
	if len(v.Events) != 1 || v.Events[0].ID != later {
		t.Errorf("scheduled after the cancel: %+v; want %s", v, later)
	}
}
