package admin_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/outbox"
)

// The headline dead count (the page and /api/stats) includes the dead
// deliveries of split events (issue 37, item 12). Run on the three
// databases (TestOnMariaDBAndPostgreSQL).
func TestStatsCountDeadDeliveries(t *testing.T) {
	f := newFixture(t, admin.Config{})
	f.deadLetter() // mailer's delivery dead, search's done: a split event
	var st map[string]float64
	f.getJSON("/admin/api/stats", &st)
	if st["dead"] != 1 || st["dead_deliveries"] != 1 || st["dead_events"] != 0 {
		t.Fatalf("api/stats = %v; want dead 1 (one dead delivery)", st)
	}
	_, page := f.do(req{method: "GET", path: "/admin/"})
	if !strings.Contains(page, `dead <a id="dead-letters" href="/admin/dead">1</a>`) {
		t.Fatalf("the page's headline does not count the dead delivery:\n%s", page)
	}
}

// POST /api/dead/purge and /api/dead/replay without a filter act on every
// dead letter only with all=true; without it they answer 400 and change
// nothing (issue 37, item 2). On the three databases.
func TestBulkWithoutFilterNeedsAll(t *testing.T) {
	f := newFixture(t, admin.Config{})
	id := f.deadLetter()
	for _, p := range []string{"/admin/api/dead/purge", "/admin/api/dead/replay"} {
		resp, body := f.post(p, nil)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "all=true") {
			t.Errorf("POST %s without a filter: %d %s; want 400 naming all=true", p, resp.StatusCode, body)
		}
		resp, body = f.post(p, url.Values{"dry_run": {"1"}})
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"count": 1`) {
			t.Errorf("POST %s dry run without a filter: %d %s; want the count", p, resp.StatusCode, body)
		}
	}
	if st := f.deliveryStatus(id, "mailer"); st != outbox.StatusDead {
		t.Fatalf("after the refused requests mailer's delivery is %v; want dead", st)
	}
	resp, body := f.post("/admin/api/dead/purge", url.Values{"all": {"true"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"count": 1`) {
		t.Fatalf("purge all=true: %d %s", resp.StatusCode, body)
	}
	if _, err := f.ob.Inspect(context.Background(), id); err == nil {
		t.Fatal("the event is still there after purge all=true")
	}
}

// Token records a fixed identity: a Basic user name is anyone's to type
// (issue 37, item 8).
func TestTokenIdentityIsFixed(t *testing.T) {
	f := newFixture(t, admin.Config{})
	r, _ := http.NewRequest("POST", f.srv.URL+"/admin/api/subscriptions/mailer/pause", nil)
	r.SetBasicAuth("the-ceo", secret)
	r.Header.Set("X-Csrf-Token", f.token) // the token of "token": who is "token"
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pause with Basic auth: %d", resp.StatusCode)
	}
	rs := f.audit.records("admin: audit")
	if len(rs) != 1 || rs[0]["who"] != "token" {
		t.Fatalf("audit: %v; want who=token, not the Basic user name", rs)
	}
}

// Failed logins are throttled per client address: after LoginBurst
// failures the address gets 429 with Retry-After, even with the right
// credentials, until the clock (injected: no waiting) gives it another
// try; other addresses and successful logins are not affected (issue 37,
// item 8).
func TestFailedLoginsThrottled(t *testing.T) {
	f := newFixture(t, admin.Config{LoginBurst: 5, LoginEvery: 10 * time.Second,
		ClientAddr: func(r *http.Request) string { return r.Header.Get("X-Test-Client") }})
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	admin.SetClock(f.h, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	try := func(client, token string) *http.Response {
		resp, _ := f.do(req{method: "GET", path: "/admin/api/stats", noAuth: true,
			header: http.Header{"Authorization": {"Bearer " + token}, "X-Test-Client": {client}}})
		return resp
	}
	// Successful requests cost nothing.
	for range 20 {
		if resp := try("a", secret); resp.StatusCode != http.StatusOK {
			t.Fatalf("a good request: %d", resp.StatusCode)
		}
	}
	for i := range 5 {
		if resp := try("a", "wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d; want 401", i+1, resp.StatusCode)
		}
	}
	for _, tok := range []string{"wrong", secret} {
		resp := try("a", tok)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "10" {
			t.Fatalf("after 5 failures (token %q): %d, Retry-After %q; want 429, 10", tok, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if resp := try("b", secret); resp.StatusCode != http.StatusOK {
		t.Fatalf("another address: %d; want 200", resp.StatusCode)
	}
	advance(4 * time.Second)
	if resp := try("a", secret); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "6" {
		t.Fatalf("4s later: %d, Retry-After %q; want 429, 6", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	advance(6 * time.Second)
	if resp := try("a", "wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("10s later, one more try: %d; want 401", resp.StatusCode)
	}
	if resp := try("a", secret); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("that try spent: %d; want 429", resp.StatusCode)
	}
	advance(10 * time.Second)
	if resp := try("a", secret); resp.StatusCode != http.StatusOK {
		t.Fatalf("10s later, the right token: %d; want 200", resp.StatusCode)
	}
	// One log record per lockout, not one per refused request.
	if n := len(f.audit.records("admin: login throttled")); n != 2 {
		t.Errorf("%d throttle records; want 2 (one per lockout)", n)
	}
}

// Audit records use LevelAudit, above ERROR: a logger set to WARN (or
// ERROR) still writes the record of a purge (issue 37, item 8).
func TestAuditSurvivesWarnLevel(t *testing.T) {
	buf := &syncBuffer{}
	f := newFixture(t, admin.Config{Logger: slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelError}))})
	f.deadLetter()
	if resp, body := f.post("/admin/api/dead/purge", url.Values{"subscription": {"mailer"}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("purge: %d %s", resp.StatusCode, body)
	}
	rs := buf.records("admin: audit")
	if len(rs) != 1 || rs[0]["action"] != "purge" || rs[0]["level"] != "ERROR+4" {
		t.Fatalf("audit records through an ERROR-level logger: %v; want the purge at ERROR+4", rs)
	}
}

// A notice shows only when the handler wrote it: ?notice= from a link is
// ignored (issue 37, item 8).
func TestNoticeIsServerSide(t *testing.T) {
	f := newFixture(t, admin.Config{})
	for _, q := range []string{"?notice=Your+session+expired%3A+log+in+at+evil.example", "?notice=Paused+mailer&notice_sig=AAAA"} {
		_, page := f.do(req{method: "GET", path: "/admin/" + q})
		if strings.Contains(page, `id="notice"`) {
			t.Errorf("GET /admin/%s shows a notice:\n%s", q, page)
		}
	}
	resp, _ := f.post("/admin/subscriptions/mailer/pause", nil)
	_, page := f.do(req{method: "GET", path: resp.Header.Get("Location")})
	if !strings.Contains(page, `id="notice">Paused mailer`) {
		t.Fatalf("the notice of a real pause is not shown:\n%s", page)
	}
	// Signed for one identity, it is not shown to another.
	other := newFixture(t, admin.Config{Authorize: func(*http.Request) (string, error) { return "mallory", nil }})
	if _, page := other.do(req{method: "GET", path: resp.Header.Get("Location")}); strings.Contains(page, `id="notice"`) {
		t.Error("a notice signed for token shows for mallory")
	}
}

// Event ids with "/", "?" or "#" make links that lead to the event: the
// page escapes them as one path segment, and the routes take them (issue
// 37, item 8). On the three databases.
func TestLinksEscapePathSegments(t *testing.T) {
	f := newFixture(t, admin.Config{})
	f.failing.Store(true)
	id := "ord/1?x=2#frag"
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, f.store.DB().DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ob.PublishTx(ctx, tx, outbox.Envelope{ID: id, Type: "bad", AggregateType: "order", AggregateID: "1", JSON: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the dead letter", func() bool { return f.deliveryStatus(id, "mailer") == outbox.StatusDead })
	esc := "/admin/events/" + url.PathEscape(id)
	_, page := f.do(req{method: "GET", path: "/admin/dead"})
	if !strings.Contains(page, `href="`+esc+`"`) {
		t.Fatalf("the dead letters page does not link %s:\n%s", esc, page)
	}
	resp, page := f.do(req{method: "GET", path: esc})
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, `href="`+esc+`?payload=1"`) || !strings.Contains(page, "<code>ord/1?x=2#frag</code>") {
		t.Fatalf("GET %s: %d\n%s", esc, resp.StatusCode, page)
	}
	var ev admin.Event
	f.getJSON("/admin/api/events/"+url.PathEscape(id), &ev)
	if ev.ID != id {
		t.Fatalf("API event: %+v", ev)
	}
	// The lookup form redirects to the escaped path.
	resp, _ = f.do(req{method: "GET", path: "/admin/event?id=" + url.QueryEscape(id)})
	if loc := resp.Header.Get("Location"); loc != esc {
		t.Fatalf("lookup: Location %q; want %q", loc, esc)
	}
	// Subscription names in form actions are escaped the same way.
	rec := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "/admin/", nil)
	r.Header.Set("Authorization", "Bearer "+secret)
	f.h.ServeHTTP(rec, r)
	if !strings.Contains(rec.Body.String(), `action="/admin/subscriptions/mailer/pause"`) {
		t.Fatalf("index page:\n%s", rec.Body.String())
	}
}
