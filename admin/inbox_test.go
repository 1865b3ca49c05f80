package admin_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

// newInboxFixture is an admin handler with an inbox on the fixture's
// database, two parked messages of consumer "billing", and a replay
// handler that fails until fixed is set.
func newInboxFixture(t *testing.T, fixed *bool) (*fixture, *inbox.Inbox) {
	t.Helper()
	f := &fixture{t: t, audit: &syncBuffer{}}
	db := testdb.Open(t, fixtureDB)
	f.store = testdb.Store(t, db)
	ob, err := outbox.New(f.store, outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })
	f.ob = ob
	d, _ := inbox.DialectNamed(f.store.Dialect().Name())
	ib, err := inbox.New(db.DB, inbox.Config{Dialect: d, Table: strings.Trim(f.store.Table(), "`\""), MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	bad := func(context.Context, inbox.Message) error { return errors.New("cannot decode") }
	for _, id := range []string{"m-1", "m-2"} {
		if res, err := ib.Handle(context.Background(), "billing", inbox.Message{ID: id, Payload: []byte("secret")}, bad); res != inbox.Parked {
			t.Fatalf("%s: %v %v", id, res, err)
		}
	}
	replay := func(context.Context, inbox.Message) error {
		if !*fixed {
			return errors.New("still broken")
		}
		return nil
	}
	h, err := admin.New(ob, admin.Config{Authorize: admin.Token(secret), BasePath: "/admin", Logger: slog.New(slog.NewJSONHandler(f.audit, nil)),
		Inbox: ib, InboxHandlers: map[string]inbox.Handler{"billing": replay}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", h)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	var v struct{ Token string }
	f.getJSON("/admin/api/csrf", &v)
	f.token = v.Token
	return f, ib
}

// The API lists parked inbox messages without payloads, replays one with
// the consumer's handler (a failure leaves it parked), and purges; each
// action is audited.
func TestInboxAPI(t *testing.T) {
	fixed := false
	f, ib := newInboxFixture(t, &fixed)
	var list struct{ Parked []admin.Parked }
	f.getJSON("/admin/api/inbox?consumer=billing", &list)
	if len(list.Parked) != 2 || list.Parked[0].ID != "m-1" || list.Parked[0].LastError != "cannot decode" || list.Parked[0].PayloadBytes != 6 {
		t.Fatalf("list: %+v", list)
	}
	if _, body := f.do(req{method: "GET", path: "/admin/api/inbox"}); strings.Contains(body, "secret") {
		t.Errorf("the list shows a payload: %s", body)
	}
	if resp, body := f.post("/admin/api/inbox/replay", url.Values{"consumer": {"billing"}, "id": {"m-1"}}); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "still broken") {
		t.Errorf("failing replay: %d %s", resp.StatusCode, body)
	}
	fixed = true
	if resp, body := f.post("/admin/api/inbox/replay", url.Values{"consumer": {"billing"}, "id": {"m-1"}}); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"applied"`) {
		t.Errorf("replay: %d %s", resp.StatusCode, body)
	}
	if resp, _ := f.post("/admin/api/inbox/replay", url.Values{"consumer": {"billing"}, "id": {"m-1"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("second replay: %d, want 404", resp.StatusCode)
	}
	if resp, body := f.post("/admin/api/inbox/replay", url.Values{"consumer": {"other"}, "id": {"m-2"}}); resp.StatusCode != http.StatusNotImplemented || !strings.Contains(body, "InboxHandlers") {
		t.Errorf("replay without a handler: %d %s", resp.StatusCode, body)
	}
	if resp, body := f.post("/admin/api/inbox/purge", url.Values{"consumer": {"billing"}, "id": {"m-2", "nope"}}); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"count": 1`) {
		t.Errorf("purge: %d %s", resp.StatusCode, body)
	}
	if left, _ := ib.Parked(context.Background(), inbox.ParkedFilter{}); len(left) != 0 {
		t.Errorf("still parked: %+v", left)
	}
	if n := len(f.audit.records("admin: audit")); n != 4 {
		t.Errorf("%d audit records, want 4 (three replays and a purge)", n)
	}
}

// Without Config.Inbox the inbox routes answer 404 and the navigation
// does not link the parked messages.
func TestInboxAPIWithoutInbox(t *testing.T) {
	f := newFixture(t, admin.Config{})
	for _, p := range []string{"/admin/api/inbox", "/admin/inbox", "/admin/inbox/billing/m-1"} {
		if resp, body := f.do(req{method: "GET", path: p}); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "Config.Inbox") {
			t.Errorf("GET %s: %d %s", p, resp.StatusCode, body)
		}
	}
	if resp, body := f.post("/admin/inbox/billing/m-1/purge", url.Values{"confirm": {"1"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("purge: %d %s", resp.StatusCode, body)
	}
	if _, page := f.do(req{method: "GET", path: "/admin/"}); strings.Contains(page, "nav-inbox") {
		t.Error("the navigation links the parked messages without an inbox")
	}
}

// The page lists parked messages (consumer, id, attempts, last error,
// when) without payloads, links each by its escaped consumer and id,
// shows one's payload only when asked (audited), and replays or purges it
// only after a confirmation page, with the CSRF token, each action
// audited. Issue 36. On the three databases.
func TestInboxPages(t *testing.T) {
	fixed := false
	f, ib := newInboxFixture(t, &fixed)
	ctx := context.Background()
	odd := "ord/1?x=2#frag"
	bad := func(context.Context, inbox.Message) error { return errors.New("no such <order>") }
	if res, err := ib.Handle(ctx, "billing", inbox.Message{ID: odd, Payload: []byte(`{"card":"4242"}`), Headers: map[string]string{"txoutbox-type": "OrderPlaced"}}, bad); res != inbox.Parked {
		t.Fatalf("park %q: %v %v", odd, res, err)
	}
	if res, err := ib.Handle(ctx, "audit", inbox.Message{ID: "a-1", Payload: []byte("x")}, bad); res != inbox.Parked {
		t.Fatalf("park a-1: %v %v", res, err)
	}
	parked := func(consumer, id string) bool {
		_, err := ib.Entry(ctx, consumer, id)
		return err == nil
	}
	esc := "/admin/inbox/billing/" + url.PathEscape(odd)

	_, page := f.do(req{method: "GET", path: "/admin/"})
	if !strings.Contains(page, `<a href="/admin/inbox" id="nav-inbox">`) {
		t.Errorf("the navigation lacks the parked messages:\n%s", page)
	}
	resp, page := f.do(req{method: "GET", path: "/admin/inbox"})
	for _, want := range []string{`href="/admin/inbox/billing/m-1"`, `href="` + esc + `"`, `href="/admin/inbox/audit/a-1"`, "<td>cannot decode</td>", "<td>no such &lt;order&gt;</td>", `<td class="num">1</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the list lacks %q", want)
		}
	}
	if resp.StatusCode != http.StatusOK || strings.Contains(page, "secret") || strings.Contains(page, "4242") {
		t.Fatalf("list: %d, shows a payload or fails:\n%s", resp.StatusCode, page)
	}
	if _, page := f.do(req{method: "GET", path: "/admin/inbox?consumer=audit"}); strings.Contains(page, "m-1") || !strings.Contains(page, "a-1") {
		t.Errorf("the consumer filter:\n%s", page)
	}

	// The detail: payload and headers only on request, and audited.
	resp, page = f.do(req{method: "GET", path: esc})
	if resp.StatusCode != http.StatusOK || strings.Contains(page, "4242") || strings.Contains(page, "OrderPlaced") || !strings.Contains(page, `href="`+esc+`?payload=1"`) ||
		!strings.Contains(page, `action="`+esc+`/replay"`) || !strings.Contains(page, `<code>ord/1?x=2#frag</code>`) || !strings.Contains(page, "15 bytes") {
		t.Fatalf("GET %s: %d\n%s", esc, resp.StatusCode, page)
	}
	if n := len(f.audit.records("admin: audit")); n != 0 {
		t.Fatalf("%d audit records before any payload was shown", n)
	}
	_, page = f.do(req{method: "GET", path: esc + "?payload=1"})
	if !strings.Contains(page, `&#34;card&#34;: &#34;4242&#34;`) || !strings.Contains(page, `&#34;txoutbox-type&#34;: &#34;OrderPlaced&#34;`) {
		t.Errorf("payload=1 lacks the payload or headers:\n%s", page)
	}
	if rs := f.audit.records("admin: audit"); len(rs) != 1 || rs[0]["action"] != "inbox show_payload" || rs[0]["id"] != odd || rs[0]["consumer"] != "billing" {
		t.Errorf("audit of the payload view: %v", rs)
	}
	if resp, _ := f.do(req{method: "GET", path: "/admin/inbox/billing/nope"}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown message: %d, want 404", resp.StatusCode)
	}

	// Without the CSRF token, nothing happens.
	resp, _ = f.do(req{method: "POST", path: esc + "/purge", form: url.Values{"confirm": {"1"}}, header: http.Header{"Origin": {f.srv.URL}, "Sec-Fetch-Site": {"same-origin"}}})
	if resp.StatusCode != http.StatusForbidden || !parked("billing", odd) {
		t.Fatalf("purge without the token: %d, parked %v", resp.StatusCode, parked("billing", odd))
	}
	// Without confirm=1, a confirmation page that changes nothing.
	resp, page = f.post(esc+"/purge", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "cannot be undone") || !strings.Contains(page, `action="`+esc+`/purge"`) || !strings.Contains(page, `name="confirm" value="1"`) || !parked("billing", odd) {
		t.Fatalf("purge confirmation: %d\n%s", resp.StatusCode, page)
	}
	resp, _ = f.post(esc+"/purge", url.Values{"confirm": {"1"}})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/admin/inbox?consumer=billing&notice=Purged+ord") || parked("billing", odd) {
		t.Fatalf("purge: %d %q", resp.StatusCode, loc)
	}
	_, page = f.do(req{method: "GET", path: resp.Header.Get("Location")})
	if !strings.Contains(page, `id="notice">Purged ord/1?x=2#frag of billing`) || strings.Contains(page, `href="`+esc+`"`) {
		t.Errorf("after the purge:\n%s", page)
	}

	// Replay: confirmation, a failure that leaves it parked, then success.
	resp, page = f.post("/admin/inbox/billing/m-1/replay", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "stays parked with the new error") || !parked("billing", "m-1") {
		t.Fatalf("replay confirmation: %d\n%s", resp.StatusCode, page)
	}
	resp, _ = f.post("/admin/inbox/billing/m-1/replay", url.Values{"confirm": {"1"}})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/admin/inbox/billing/m-1?") || !parked("billing", "m-1") {
		t.Fatalf("failing replay: %d %q", resp.StatusCode, loc)
	}
	_, page = f.do(req{method: "GET", path: resp.Header.Get("Location")})
	if !strings.Contains(page, "failed again, still parked: still broken") || !strings.Contains(page, `id="last-error">still broken`) {
		t.Errorf("after the failing replay:\n%s", page)
	}
	fixed = true
	resp, _ = f.post("/admin/inbox/billing/m-1/replay", url.Values{"confirm": {"1"}})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "notice=Replayed+m-1+of+billing%3A+applied") || parked("billing", "m-1") {
		t.Fatalf("replay: %d %q", resp.StatusCode, loc)
	}
	if resp, _ := f.post("/admin/inbox/billing/m-1/replay", url.Values{"confirm": {"1"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("replay of a message no longer parked: %d, want 404", resp.StatusCode)
	}
	// A consumer without a handler: no replay offered, and refused.
	if _, page := f.do(req{method: "GET", path: "/admin/inbox/audit/a-1"}); strings.Contains(page, `id="replay"`) || !strings.Contains(page, `id="no-handler"`) {
		t.Errorf("replay offered without a handler:\n%s", page)
	}
	if resp, body := f.post("/admin/inbox/audit/a-1/replay", url.Values{"confirm": {"1"}}); resp.StatusCode != http.StatusNotImplemented || !strings.Contains(body, "InboxHandlers") || !parked("audit", "a-1") {
		t.Errorf("replay without a handler: %d %s", resp.StatusCode, body)
	}

	var actions []string
	for _, r := range f.audit.records("admin: audit") {
		a := r["action"].(string)
		if res, ok := r["result"].(string); ok {
			a += " " + res
		}
		actions = append(actions, a)
	}
	want := "inbox show_payload,inbox purge,inbox replay parked,inbox replay applied"
	if got := strings.Join(actions, ","); got != want {
		t.Errorf("audit actions: %s\nwant %s", got, want)
	}
}

// The list pages by 50, one consumer's or all, and the next page goes on
// after the last entry of the one before.
func TestInboxPagesPaging(t *testing.T) {
	fixed := false
	f, ib := newInboxFixture(t, &fixed) // m-1, m-2 of billing
	bad := func(context.Context, inbox.Message) error { return errors.New("bad") }
	for i := range 50 {
		id := fmt.Sprintf("p-%02d", i)
		if res, err := ib.Handle(context.Background(), "billing", inbox.Message{ID: id, Payload: []byte("x")}, bad); res != inbox.Parked {
			t.Fatalf("%s: %v %v", id, res, err)
		}
	}
	for _, q := range []string{"", "?consumer=billing"} {
		resp, page := f.do(req{method: "GET", path: "/admin/inbox" + q})
		if n := strings.Count(page, `<tr class="parked">`); resp.StatusCode != http.StatusOK || n != 50 || strings.Contains(page, ">p-48<") {
			t.Fatalf("first page%s: %d, %d rows", q, resp.StatusCode, n)
		}
		next := regexp.MustCompile(`href="([^"]+)" id="next"`).FindStringSubmatch(page)
		if next == nil {
			t.Fatalf("first page%s: no next link", q)
		}
		_, page = f.do(req{method: "GET", path: html.UnescapeString(next[1])})
		if n := strings.Count(page, `<tr class="parked">`); n != 2 || !strings.Contains(page, "<code>p-48</code>") || !strings.Contains(page, "<code>p-49</code>") || strings.Contains(page, `id="next"`) || !strings.Contains(page, "first page") {
			t.Errorf("second page%s (%s): %d rows\n%s", q, next[1], n, page)
		}
	}
}
