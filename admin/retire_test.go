package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// A subscription that another instance registered ("legacy") is listed
// with a Retire button; the retire is a dry run without confirm=1 and is
// refused while an instance registered it recently. Once no instance
// registers it, the page lists it as unregistered with what it holds, and
// a confirmed retire drops its deliveries and completes the events.
func TestRetire(t *testing.T) {
	f := newFixture(t, admin.Config{})
	ctx := context.Background()
	if _, err := f.store.SyncSubscriptions(ctx, []driver.SubscriptionInfo{{Name: "legacy"}}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the instance to learn of legacy", func() bool {
		for _, s := range f.ob.Subscriptions() {
			if s.Name == "legacy" {
				return true
			}
		}
		return false
	})
	id := f.publish("ok")
	f.waitFor("legacy's delivery", func() bool { return f.deliveryStatus(id, "legacy") == outbox.StatusNew })
	_, page := f.do(req{method: "GET", path: "/admin/"})
	if !strings.Contains(page, `action="/admin/subscriptions/legacy/retire"`) || strings.Contains(page, `action="/admin/subscriptions/mailer/retire"`) {
		t.Fatalf("want a Retire button for legacy (another instance's) and none for mailer (this one's):\n%s", page)
	}
	resp, body := f.post("/admin/api/subscriptions/legacy/retire", nil)
	var v admin.RetireResult
	if json.Unmarshal([]byte(body), &v); resp.StatusCode != http.StatusOK || v.Retired || v.Holds == nil || v.Holds.Pending < 1 {
		t.Fatalf("retire without confirm: %d %s; want a dry run showing what legacy holds", resp.StatusCode, body)
	}
	if resp, body := f.post("/admin/api/subscriptions/legacy/retire", url.Values{"confirm": {"1"}}); resp.StatusCode != http.StatusConflict {
		t.Fatalf("retire of a subscription registered just now: %d %s; want 409", resp.StatusCode, body)
	}
	if st := f.deliveryStatus(id, "legacy"); st != outbox.StatusNew {
		t.Fatalf("legacy's delivery after the refused retire: %v; want NEW", st)
	}
	// No instance registers legacy any more (its row removed, as an
	// expiry elsewhere would have left it): unregistered, holding one.
	if _, err := f.store.DB().ExecContext(ctx, "DELETE FROM "+f.store.SubscriptionsTable()+" WHERE name = 'legacy'"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the page to list legacy as unregistered (at the instance's next refresh)", func() bool {
		_, page := f.do(req{method: "GET", path: "/admin/"})
		return strings.Contains(page, "no instance (unregistered)")
	})
	// The page asks first, then retires.
	_, page = f.do(req{method: "POST", path: "/admin/subscriptions/legacy/retire", form: url.Values{"csrf_token": {f.token}}})
	if !strings.Contains(page, `id="confirm"`) {
		t.Fatalf("the page retired without a confirmation:\n%s", page)
	}
	if st := f.deliveryStatus(id, "legacy"); st != outbox.StatusNew {
		t.Fatalf("legacy's delivery after the confirmation page: %v; want NEW", st)
	}
	resp, body = f.do(req{method: "POST", path: "/admin/subscriptions/legacy/retire", form: url.Values{"csrf_token": {f.token}, "confirm": {"1"}}})
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("notice") != "Retired legacy: 1 deliveries dropped, 1 events completed" {
		t.Fatalf("confirmed retire: %d, Location %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	rec, err := f.ob.Inspect(ctx, id)
	if err != nil || rec.Status != outbox.StatusDone {
		t.Fatalf("the event after the retire: %v %v; want DONE", rec.Status, err)
	}
	if rs := f.audit.records("admin: audit"); len(rs) == 0 || rs[len(rs)-1]["action"] != "retire" {
		t.Fatalf("no audit record of the retire: %v", rs)
	}
}
