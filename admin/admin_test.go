package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

const secret = "s3cret-admin-token"

// syncBuffer is the audit log the tests read.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns the audit records with the given msg, decoded.
func (b *syncBuffer) records(msg string) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(b.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// fixture is an outbox on SQLite with two subscriptions: mailer, which
// fails permanently for events of type "bad" while failing is set, and
// search, which takes everything; and the admin handler at /admin.
type fixture struct {
	t       *testing.T
	store   *sqlstore.Store
	ob      *outbox.Outbox
	srv     *httptest.Server
	h       http.Handler
	audit   *syncBuffer
	failing atomic.Bool
	token   string // the CSRF token of the identity "token"
}

func newFixture(t *testing.T, cfg admin.Config, extra ...func(*fixture) outbox.Subscription) *fixture {
	t.Helper()
	return newFixtureWith(t, sqlstore.Options{}, cfg, extra...)
}

// newFixtureWith is newFixture on a store with opts.
func newFixtureWith(t *testing.T, opts sqlstore.Options, cfg admin.Config, extra ...func(*fixture) outbox.Subscription) *fixture {
	t.Helper()
	f := &fixture{t: t, audit: &syncBuffer{}}
	f.failing.Store(true)
	db := testdb.Open(t, fixtureDB)
	f.store = testdb.StoreWith(t, db, opts)
	ob, err := outbox.New(f.store, outbox.Config{PollInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ob.Handle("mailer", func(ctx context.Context, ev outbox.Event) error {
		if ev.Type == "bad" && f.failing.Load() {
			return outbox.Permanent(errors.New("smtp: 550 mailbox unavailable"))
		}
		return nil
	})
	ob.Handle("search", func(context.Context, outbox.Event) error { return nil })
	for _, sub := range extra {
		if err := ob.Subscribe(sub(f)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })
	f.ob = ob
	if cfg.Authorize == nil {
		cfg.Authorize = admin.Token(secret)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(f.audit, nil))
	}
	cfg.BasePath = "/admin"
	switch cfg.Store.(type) {
	case nil:
		cfg.Store = f.store
	case noPurge:
		cfg.Store = nil
	}
	h, err := admin.New(ob, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	mux := http.NewServeMux()
	mux.Handle("/admin/", h)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	if resp, body := f.do(req{method: "GET", path: "/admin/api/csrf"}); resp.StatusCode == http.StatusOK {
		var v struct{ Token string }
		json.Unmarshal([]byte(body), &v)
		f.token = v.Token
	}
	return f
}

// publish writes an event of type typ and returns its id.
func (f *fixture) publish(typ string) string {
	f.t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, f.store.DB().DB, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	defer tx.Rollback()
	id, err := f.ob.PublishTx(ctx, tx, outbox.Envelope{Type: outbox.EventType(typ), AggregateType: "order", AggregateID: "42", JSON: []byte(`{"email":"ada@example.com"}`)})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		f.t.Fatal(err)
	}
	return id
}

// waitFor polls cond: the engine records outcomes asynchronously and
// offers no signal for "written".
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// deadLetter publishes an event that mailer fails permanently and waits
// until its dead delivery is recorded; search delivers it.
func (f *fixture) deadLetter() string {
	f.t.Helper()
	id := f.publish("bad")
	f.waitFor("the dead letter", func() bool { return f.deliveryStatus(id, "mailer") == outbox.StatusDead })
	return id
}

func (f *fixture) deliveryStatus(id, sub string) outbox.Status {
	rec, err := f.ob.Inspect(context.Background(), id)
	if err != nil {
		return -1
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == sub {
			return d.Status
		}
	}
	return -1
}

type req struct {
	method, path string
	form         url.Values
	header       http.Header
	noAuth       bool
}

func (f *fixture) do(r req) (*http.Response, string) {
	f.t.Helper()
	var body io.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	}
	hr, err := http.NewRequest(r.method, f.srv.URL+r.path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if r.form != nil {
		hr.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if !r.noAuth {
		hr.Header.Set("Authorization", "Bearer "+secret)
	}
	for k, vs := range r.header {
		hr.Header[k] = vs
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(hr)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// post sends a same-origin form POST with the CSRF token.
func (f *fixture) post(path string, form url.Values) (*http.Response, string) {
	f.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf_token", f.token)
	return f.do(req{method: "POST", path: path, form: form, header: http.Header{"Origin": {f.srv.URL}, "Sec-Fetch-Site": {"same-origin"}}})
}

func (f *fixture) getJSON(path string, v any) {
	f.t.Helper()
	resp, body := f.do(req{method: "GET", path: path})
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		f.t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

func (f *fixture) paused(name string) bool {
	for _, s := range f.ob.Subscriptions() {
		if s.Name == name {
			return s.Paused
		}
	}
	f.t.Fatalf("no subscription %s", name)
	return false
}

func TestNewRequiresAuthorize(t *testing.T) {
	ob, err := outbox.New(testdb.Store(t, testdb.SQLite(t)), outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.New(ob, admin.Config{}); err == nil || !strings.Contains(err.Error(), "Authorize") {
		t.Fatalf("New without Authorize: %v; want an error naming Authorize", err)
	}
	if _, err := admin.New(ob, admin.Config{Authorize: admin.Token("x"), BasePath: "admin"}); err == nil {
		t.Fatal("New with a relative BasePath: no error")
	}
}

// routes are every route, with a request that would succeed with
// authorization.
var routes = []struct{ method, path string }{
	{"GET", "/admin/"},
	{"GET", "/admin/dead"},
	{"GET", "/admin/event?id=x"},
	{"GET", "/admin/events/x"},
	{"POST", "/admin/subscriptions/mailer/pause"},
	{"POST", "/admin/subscriptions/mailer/resume"},
	{"POST", "/admin/dead/replay"},
	{"POST", "/admin/dead/purge"},
	{"GET", "/admin/api/csrf"},
	{"GET", "/admin/api/subscriptions"},
	{"POST", "/admin/api/subscriptions/mailer/pause"},
	{"POST", "/admin/api/subscriptions/mailer/resume"},
	{"GET", "/admin/api/stats"},
	{"GET", "/admin/api/dead"},
	{"POST", "/admin/api/dead/replay"},
	{"POST", "/admin/api/dead/purge"},
	{"GET", "/admin/api/events/x"},
	{"GET", "/admin/blocked"},
	{"POST", "/admin/blocked/skip?id=x"},
	{"GET", "/admin/api/blocked"},
	{"POST", "/admin/api/dead/skip?id=x"},
	{"GET", "/admin/scheduled"},
	{"POST", "/admin/scheduled/cancel?id=x"},
	{"GET", "/admin/api/scheduled"},
	{"POST", "/admin/api/scheduled/cancel?id=x"},
	{"GET", "/admin/api/inbox"},
	{"POST", "/admin/api/inbox/replay?consumer=c&id=x"},
	{"POST", "/admin/api/inbox/purge?consumer=c&id=x"},
	{"GET", "/admin/inbox"},
	{"GET", "/admin/inbox/c/x"},
	{"POST", "/admin/inbox/c/x/replay"},
	{"POST", "/admin/inbox/c/x/purge"},
	{"GET", "/admin/no-such-page"},
	{"DELETE", "/admin/api/dead"},
}

// Without credentials, with wrong ones, and for a caller the authorizer
// forbids, every route answers 401 or 403 and changes nothing; each
// refusal is in the audit log.
func TestEveryRouteNeedsAuthorization(t *testing.T) {
	// 46 failed logins in a row: the throttle (TestFailedLoginsThrottled) off.
	f := newFixture(t, admin.Config{Realm: "txoutbox admin", LoginBurst: -1})
	id := f.deadLetter()
	for _, rt := range routes {
		resp, body := f.do(req{method: rt.method, path: rt.path, noAuth: true, form: url.Values{"csrf_token": {f.token}, "confirm": {"1"}}})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s without credentials: %d %s; want 401", rt.method, rt.path, resp.StatusCode, body)
		}
		if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, `Basic realm="txoutbox admin"`) {
			t.Errorf("%s %s: WWW-Authenticate %q", rt.method, rt.path, got)
		}
		if strings.Contains(body, "mailer") || resp.Header.Get("X-CSRF-Token") != "" {
			t.Errorf("%s %s: a 401 leaks data: %s", rt.method, rt.path, body)
		}
		resp, _ = f.do(req{method: rt.method, path: rt.path, noAuth: true, header: http.Header{"Authorization": {"Bearer wrong"}}})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s %s with a wrong token: %d; want 401", rt.method, rt.path, resp.StatusCode)
		}
	}
	if n := len(f.audit.records("admin: request denied")); n != 2*len(routes) {
		t.Errorf("%d denied requests in the audit log; want %d", n, 2*len(routes))
	}
	if f.paused("mailer") || f.deliveryStatus(id, "mailer") != outbox.StatusDead {
		t.Fatal("an unauthorized request changed something")
	}

	forbid := newFixture(t, admin.Config{Authorize: func(r *http.Request) (string, error) {
		return "bob", errors.Join(errors.New("bob is a viewer"), admin.ErrForbidden)
	}})
	for _, rt := range routes {
		resp, _ := forbid.do(req{method: rt.method, path: rt.path})
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s %s forbidden: %d; want 403", rt.method, rt.path, resp.StatusCode)
		}
	}
	// No identity without an error is no authorization either.
	anon := newFixture(t, admin.Config{Authorize: func(*http.Request) (string, error) { return "", nil }})
	if resp, _ := anon.do(req{method: "GET", path: "/admin/"}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("empty identity: %d; want 401", resp.StatusCode)
	}
}

// A POST without the CSRF token, with a wrong one, with another
// identity's, or from another site (even with the right token) is
// rejected with 403 and changes nothing; the same-origin POST with the
// token works. Each rejection is in the audit log.
func TestCSRF(t *testing.T) {
	f := newFixture(t, admin.Config{})
	other := newFixture(t, admin.Config{Authorize: func(*http.Request) (string, error) { return "mallory", nil }})
	path := "/admin/subscriptions/mailer/pause"
	same := http.Header{"Origin": {f.srv.URL}, "Sec-Fetch-Site": {"same-origin"}}
	for _, c := range []struct {
		name   string
		form   url.Values
		header http.Header
	}{
		{"no token", url.Values{}, same},
		{"wrong token", url.Values{"csrf_token": {"AAAA"}}, same},
		{"another identity's token", url.Values{"csrf_token": {other.token}}, same},
		{"cross-site, with the token", url.Values{"csrf_token": {f.token}}, http.Header{"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"cross-site"}}},
		{"same-site subdomain, with the token", url.Values{"csrf_token": {f.token}}, http.Header{"Origin": {"https://evil.example"}, "Sec-Fetch-Site": {"same-site"}}},
		{"foreign Origin, no Sec-Fetch-Site, with the token", url.Values{"csrf_token": {f.token}}, http.Header{"Origin": {"https://evil.example"}}},
		{"API, header token from another site", url.Values{}, http.Header{"X-Csrf-Token": {f.token}, "Origin": {"https://evil.example"}}},
	} {
		for _, p := range []string{path, "/admin/api/subscriptions/mailer/pause"} {
			resp, body := f.do(req{method: "POST", path: p, form: c.form, header: c.header})
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: POST %s: %d %s; want 403", c.name, p, resp.StatusCode, body)
			}
		}
	}
	if f.paused("mailer") {
		t.Fatal("a rejected POST paused the subscription")
	}
	if n := len(f.audit.records("admin: request rejected")); n != 14 {
		t.Errorf("%d rejected requests in the audit log; want 14", n)
	}
	// A non-browser client (no Origin, no Sec-Fetch-Site) with the header
	// token, and a browser form with the field, are accepted.
	if resp, body := f.do(req{method: "POST", path: "/admin/api/subscriptions/mailer/pause", header: http.Header{"X-Csrf-Token": {f.token}}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("API POST with the token: %d %s", resp.StatusCode, body)
	}
	if resp, body := f.post("/admin/subscriptions/mailer/resume", nil); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("form POST with the token: %d %s", resp.StatusCode, body)
	}
	// GET never changes state: the action routes take POST only.
	if resp, _ := f.do(req{method: "GET", path: path}); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET %s: %d; want 405", path, resp.StatusCode)
	}
}

func TestPauseResume(t *testing.T) {
	f := newFixture(t, admin.Config{})
	// The page: a form POST pauses, then redirects to the list, which
	// shows it paused with a Resume button.
	resp, _ := f.post("/admin/subscriptions/mailer/pause", nil)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/admin/?notice=Paused+mailer") {
		t.Fatalf("pause: %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if !f.paused("mailer") || f.paused("search") {
		t.Fatal("mailer not paused, or search paused too")
	}
	_, page := f.do(req{method: "GET", path: resp.Header.Get("Location")})
	for _, want := range []string{`id="notice">Paused mailer`, `<span class="state-paused">paused</span>`, `action="/admin/subscriptions/mailer/resume"`, `action="/admin/subscriptions/search/pause"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page after pause lacks %q", want)
		}
	}
	// An event published while paused waits for mailer; resume delivers it.
	id := f.publish("ok")
	f.waitFor("mailer's delivery held while paused", func() bool { return f.deliveryStatus(id, "mailer") == outbox.StatusNew })
	if resp, _ := f.post("/admin/subscriptions/mailer/resume", nil); resp.StatusCode != http.StatusSeeOther || f.paused("mailer") {
		t.Fatalf("resume: %d, paused %v", resp.StatusCode, f.paused("mailer"))
	}
	f.waitFor("mailer's delivery after resume", func() bool { return f.deliveryStatus(id, "mailer") == outbox.StatusDone })

	// The API.
	resp, body := f.do(req{method: "POST", path: "/admin/api/subscriptions/search/pause", header: http.Header{"X-Csrf-Token": {f.token}}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"paused": true`) || !f.paused("search") {
		t.Fatalf("API pause: %d %s", resp.StatusCode, body)
	}
	var subs struct{ Subscriptions []admin.Subscription }
	f.getJSON("/admin/api/subscriptions", &subs)
	if len(subs.Subscriptions) != 2 || subs.Subscriptions[1].Name != "search" || !subs.Subscriptions[1].Paused || subs.Subscriptions[0].Paused ||
		subs.Subscriptions[0].Circuit != "closed" || !subs.Subscriptions[0].Local || subs.Subscriptions[0].Lag == nil {
		t.Fatalf("API subscriptions: %+v", subs.Subscriptions)
	}
	resp, body = f.do(req{method: "POST", path: "/admin/api/subscriptions/search/resume", header: http.Header{"X-Csrf-Token": {f.token}}})
	if resp.StatusCode != http.StatusOK || f.paused("search") {
		t.Fatalf("API resume: %d %s", resp.StatusCode, body)
	}
	// An unknown subscription is a 404 (audited as a failure).
	if resp, _ := f.post("/admin/api/subscriptions/nope/pause", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("pause of an unknown subscription: %d; want 404", resp.StatusCode)
	}

	var actions []string
	for _, r := range f.audit.records("admin: audit") {
		if r["who"] != "token" || r["remote"] == "" {
			t.Errorf("audit record without who or remote: %v", r)
		}
		actions = append(actions, r["action"].(string)+" "+r["subscription"].(string))
	}
	if got, want := strings.Join(actions, ", "), "pause mailer, resume mailer, pause search, resume search, pause nope"; got != want {
		t.Errorf("audit actions: %s; want %s", got, want)
	}
}

// The page's replay: a dry run counts the dead letters and asks to
// confirm, changing nothing; the confirmation replays them (only the
// subscription that gave up runs again) and redirects with the count.
func TestReplayDryRunThenConfirm(t *testing.T) {
	f := newFixture(t, admin.Config{})
	id := f.deadLetter()
	f.failing.Store(false)

	_, page := f.do(req{method: "GET", path: "/admin/dead?subscription=mailer"})
	if !strings.Contains(page, `href="/admin/events/`+id+`"`) || !strings.Contains(page, "smtp: 550 mailbox unavailable") || !strings.Contains(page, `id="replay"`) {
		t.Fatalf("the dead letters page does not list %s with its error and a replay button:\n%s", id, page)
	}
	resp, page := f.post("/admin/dead/replay", url.Values{"subscription": {"mailer"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Dry run: <strong>1</strong> dead letter matches") || !strings.Contains(page, `name="confirm" value="1"`) {
		t.Fatalf("dry run: %d\n%s", resp.StatusCode, page)
	}
	if st := f.deliveryStatus(id, "mailer"); st != outbox.StatusDead {
		t.Fatalf("after the dry run mailer's delivery is %v; want still dead", st)
	}
	resp, _ = f.post("/admin/dead/replay", url.Values{"subscription": {"mailer"}, "confirm": {"1"}})
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/admin/dead?notice=Replayed+1+dead+letter&notice_sig=") || !strings.HasSuffix(loc, "&subscription=mailer") {
		t.Fatalf("confirm: %d, Location %q", resp.StatusCode, loc)
	}
	f.waitFor("the replayed delivery", func() bool { return f.deliveryStatus(id, "mailer") == outbox.StatusDone })
	_, page = f.do(req{method: "GET", path: loc})
	if !strings.Contains(page, "Replayed 1 dead letter") || !strings.Contains(page, `id="no-dead"`) {
		t.Fatalf("the dead letters page after the replay:\n%s", page)
	}
	// Nothing left: the dry run says so and offers no confirmation.
	if _, page := f.post("/admin/dead/replay", nil); !strings.Contains(page, "No dead letters match") || strings.Contains(page, `id="confirm"`) {
		t.Fatalf("dry run with nothing dead:\n%s", page)
	}

	// The API: dry_run counts, without it replays.
	f.failing.Store(true)
	id2 := f.deadLetter()
	f.failing.Store(false)
	var v struct {
		DryRun bool `json:"dry_run"`
		Count  int
	}
	resp, body := f.post("/admin/api/dead/replay", url.Values{"type": {"bad"}, "dry_run": {"1"}})
	if json.Unmarshal([]byte(body), &v); resp.StatusCode != http.StatusOK || !v.DryRun || v.Count != 1 || f.deliveryStatus(id2, "mailer") != outbox.StatusDead {
		t.Fatalf("API dry run: %d %s", resp.StatusCode, body)
	}
	resp, body = f.post("/admin/api/dead/replay", url.Values{"type": {"bad"}})
	if json.Unmarshal([]byte(body), &v); resp.StatusCode != http.StatusOK || v.DryRun || v.Count != 1 {
		t.Fatalf("API replay: %d %s", resp.StatusCode, body)
	}
	f.waitFor("the API-replayed delivery", func() bool { return f.deliveryStatus(id2, "mailer") == outbox.StatusDone })

	var got []string
	for _, r := range f.audit.records("admin: audit") {
		filter, _ := r["filter"].(map[string]any)
		got = append(got, r["action"].(string)+" dry_run="+boolString(r["dry_run"])+" count="+numString(r["count"])+" filter="+mapString(filter))
	}
	want := []string{
		"replay dry_run=true count=1 filter=subscription:mailer",
		"replay dry_run=false count=1 filter=subscription:mailer",
		"replay dry_run=true count=0 filter=",
		"replay dry_run=true count=1 filter=type:bad",
		"replay dry_run=false count=1 filter=type:bad",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func boolString(v any) string {
	b, _ := v.(bool)
	if b {
		return "true"
	}
	return "false"
}

func numString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func mapString(m map[string]any) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+":"+v.(string))
	}
	return strings.Join(parts, ",")
}

func TestPurge(t *testing.T) {
	f := newFixture(t, admin.Config{Store: noPurge{}})
	f.deadLetter()
	// Without a Purger the page and the API say so.
	if resp, _ := f.post("/admin/dead/purge", nil); resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("purge without a Purger: %d; want 501", resp.StatusCode)
	}
	if resp, _ := f.post("/admin/api/dead/purge", nil); resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("API purge without a Purger: %d; want 501", resp.StatusCode)
	}
	if _, page := f.do(req{method: "GET", path: "/admin/dead"}); strings.Contains(page, `id="purge"`) {
		t.Fatal("the page offers purge without a Purger")
	}

	f = newFixture(t, admin.Config{})
	a, b := f.deadLetter(), f.deadLetter()
	resp, page := f.post("/admin/dead/purge", url.Values{"type": {"bad"}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "Dry run: <strong>2</strong> dead letters match") || !strings.Contains(page, "cannot be undone") {
		t.Fatalf("purge dry run: %d\n%s", resp.StatusCode, page)
	}
	resp, _ = f.post("/admin/dead/purge", url.Values{"type": {"bad"}, "confirm": {"1"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "notice=Purged+2+dead+letters") {
		t.Fatalf("purge: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, id := range []string{a, b} {
		// search delivered it, mailer's dead delivery is gone: so is the event.
		if _, err := f.ob.Inspect(context.Background(), id); !errors.Is(err, outbox.ErrNotFound) {
			t.Errorf("event %s after purge: %v; want not found", id, err)
		}
	}
	if rs := f.audit.records("admin: audit"); len(rs) != 2 || rs[1]["action"] != "purge" || rs[1]["count"] != 2.0 || rs[1]["dry_run"] != false {
		t.Errorf("audit: %v", rs)
	}
}

// noPurge as Config.Store makes the fixture's handler one without a
// Purger.
type noPurge struct{}

// Lookup by id shows the event, its per-subscription state and history,
// and its payload only when asked (which the audit log records); an
// unknown id is a 404.
func TestLookup(t *testing.T) {
	f := newFixture(t, admin.Config{})
	id := f.deadLetter()

	var ev admin.Event
	f.getJSON("/admin/api/events/"+id, &ev)
	if ev.ID != id || ev.Type != "bad" || ev.Status != "split" || ev.Payload != nil || len(ev.Deliveries) != 2 {
		t.Fatalf("API event: %+v", ev)
	}
	if d := ev.Deliveries[0]; d.Subscription != "mailer" || d.Status != "dead" || len(d.History) != 1 || d.History[0].N != 1 || !strings.Contains(d.History[0].Error, "550") {
		t.Errorf("mailer's delivery: %+v", d)
	}
	if d := ev.Deliveries[1]; d.Subscription != "search" || d.Status != "done" || !d.Inferred {
		t.Errorf("search's delivery: %+v", d)
	}
	if len(f.audit.records("admin: audit")) != 0 {
		t.Fatal("a lookup without payload was audited as showing it")
	}
	f.getJSON("/admin/api/events/"+id+"?payload=1", &ev)
	var compact bytes.Buffer
	json.Compact(&compact, ev.Payload)
	if compact.String() != `{"email":"ada@example.com"}` {
		t.Fatalf("API payload: %s", ev.Payload)
	}

	// The page: the lookup form redirects to the event.
	resp, _ := f.do(req{method: "GET", path: "/admin/event?id=" + id})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/events/"+id {
		t.Fatalf("lookup form: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	_, page := f.do(req{method: "GET", path: "/admin/events/" + id})
	for _, want := range []string{`id="delivery-mailer"`, `<span class="state-dead">dead</span>`, "smtp: 550 mailbox unavailable</li>", `<span class="state-done">done</span> <small>(at the first try)</small>`, `id="show-payload"`} {
		if !strings.Contains(page, want) {
			t.Errorf("event page lacks %q", want)
		}
	}
	if strings.Contains(page, "ada@example.com") {
		t.Error("the event page shows the payload without being asked")
	}
	_, page = f.do(req{method: "GET", path: "/admin/events/" + id + "?payload=1"})
	if !strings.Contains(page, `&#34;email&#34;: &#34;ada@example.com&#34;`) {
		t.Errorf("the event page with payload=1 lacks it:\n%s", page)
	}
	rs := f.audit.records("admin: audit")
	if len(rs) != 2 || rs[0]["action"] != "show_payload" || rs[0]["event"] != id || rs[0]["who"] != "token" {
		t.Errorf("payload views in the audit log: %v", rs)
	}

	for _, p := range []string{"/admin/events/nope", "/admin/api/events/nope"} {
		if resp, _ := f.do(req{method: "GET", path: p}); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d; want 404", p, resp.StatusCode)
		}
	}
}

func TestDeadFilters(t *testing.T) {
	f := newFixture(t, admin.Config{})
	id := f.deadLetter()
	type page struct {
		Letters []admin.DeadLetter
		Next    string
	}
	for q, want := range map[string]int{
		"":                        1,
		"?subscription=mailer":    1,
		"?subscription=search":    0,
		"?type=bad":               1,
		"?type=other":             0,
		"?error=550":              1,
		"?error=timeout":          0,
		"?since=2000-01-01T00:00": 1,
		"?until=2000-01-01":       0,
		"?after=" + id:            0,
		"?limit=1":                1,
	} {
		var p page
		f.getJSON("/admin/api/dead"+q, &p)
		if len(p.Letters) != want {
			t.Errorf("dead%s: %d letters; want %d", q, len(p.Letters), want)
		}
	}
	var p page
	f.getJSON("/admin/api/dead?limit=1", &p)
	if p.Next != id || p.Letters[0].Subscription != "mailer" || p.Letters[0].Attempts != 1 {
		t.Errorf("dead?limit=1: %+v", p)
	}
	for _, q := range []string{"?since=yesterday", "?limit=0", "?limit=9999"} {
		if resp, _ := f.do(req{method: "GET", path: "/admin/api/dead" + q}); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("dead%s: %d; want 400", q, resp.StatusCode)
		}
	}
	_, html := f.do(req{method: "GET", path: "/admin/dead?type=other"})
	if !strings.Contains(html, "No dead letters match the filter") || !strings.Contains(html, `value="other"`) {
		t.Errorf("the filtered page:\n%s", html)
	}
}

// Token accepts the secret as a bearer token or a Basic password; who is
// "token" either way (a Basic user name is not verified).
func TestToken(t *testing.T) {
	auth := admin.Token("pw")
	r := httptest.NewRequest("GET", "/", nil)
	r.SetBasicAuth("alice", "pw")
	if who, err := auth(r); who != "token" || err != nil {
		t.Errorf("basic: %q %v", who, err)
	}
	r.SetBasicAuth("alice", "nope")
	if _, err := auth(r); err == nil {
		t.Error("basic with a wrong password accepted")
	}
	r = httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer pw")
	if who, err := auth(r); who != "token" || err != nil {
		t.Errorf("bearer: %q %v", who, err)
	}
	r.Header.Set("Authorization", "Bearer pw2")
	if _, err := auth(r); err == nil {
		t.Error("wrong bearer accepted")
	}
}

// fixtureDB is the database newFixture opens: SQLite, unless
// TestOnMariaDBAndPostgreSQL runs the tests again on the servers.
var fixtureDB = "sqlite"

// The tests that read and write the outbox through the admin handler, on
// MariaDB and PostgreSQL too.
func TestOnMariaDBAndPostgreSQL(t *testing.T) {
	defer func() { fixtureDB = "sqlite" }()
	for _, name := range []string{"mysql", "postgres"} {
		fixtureDB = name
		t.Run(name, func(t *testing.T) {
			testdb.Open(t, name) // skip (or fail in CI) early without the server
			t.Run("PauseResume", TestPauseResume)
			t.Run("ReplayDryRunThenConfirm", TestReplayDryRunThenConfirm)
			t.Run("Purge", TestPurge)
			t.Run("Lookup", TestLookup)
			t.Run("DeadFilters", TestDeadFilters)
			t.Run("CSRF", TestCSRF)
			t.Run("BlockedKeysAndSkip", TestBlockedKeysAndSkip)
			t.Run("ScheduledAndCancel", TestScheduledAndCancel)
			t.Run("StatsCountDeadDeliveries", TestStatsCountDeadDeliveries)
			t.Run("BulkWithoutFilterNeedsAll", TestBulkWithoutFilterNeedsAll)
			t.Run("LinksEscapePathSegments", TestLinksEscapePathSegments)
			t.Run("Retire", TestRetire)
			t.Run("InboxAPI", TestInboxAPI)
			t.Run("InboxPages", TestInboxPages)
			t.Run("InboxPagesPaging", TestInboxPagesPaging)
		})
	}
}

// ledger is an Ordered subscription that fails events of type "bad"
// permanently while failing is set, and sends the id of every event it
// delivers on got.
func ledger(got chan<- string) func(*fixture) outbox.Subscription {
	return func(f *fixture) outbox.Subscription {
		return outbox.Subscription{Name: "ledger", Order: outbox.Ordered, Handler: func(ctx context.Context, ev outbox.Event) error {
			if ev.Type == "bad" && f.failing.Load() {
				return outbox.Permanent(errors.New("ledger: account closed"))
			}
			got <- ev.ID
			return nil
		}}
	}
}

// A dead event of an Ordered subscription blocks its key: the API and the
// page list the key with the dead event and how many wait behind it. The
// skip needs the CSRF token (403 without, nothing changes) and, on the
// page, a confirmation; then the key goes on (the waiting event is
// delivered), the key is no longer listed, and the audit log has the skip.
func TestBlockedKeysAndSkip(t *testing.T) {
	got := make(chan string, 16)
	f := newFixture(t, admin.Config{}, ledger(got))
	dead := f.publish("bad")
	f.waitFor("the dead ordered delivery", func() bool { return f.deliveryStatus(dead, "ledger") == outbox.StatusDead })
	next := f.publish("good")

	var v struct {
		Keys []admin.BlockedKey
		Next string
	}
	f.getJSON("/admin/api/blocked", &v)
	if len(v.Keys) != 1 || v.Keys[0].Key != "order:42" || v.Keys[0].Subscription != "ledger" || v.Keys[0].EventID != dead || v.Keys[0].Type != "bad" || v.Keys[0].Waiting != 1 || v.Next != "" {
		t.Fatalf("blocked keys: %+v", v)
	}
	var subs struct{ Subscriptions []admin.Subscription }
	f.getJSON("/admin/api/subscriptions", &subs)
	for _, s := range subs.Subscriptions {
		if s.Name == "ledger" && (s.Lag == nil || s.Lag.BlockedKeys != 1) {
			t.Fatalf("ledger's lag: %+v; want 1 blocked key", s.Lag)
		}
	}
	f.getJSON("/admin/api/blocked?limit=1", &v)
	if len(v.Keys) != 1 || v.Next != "order:42" {
		t.Fatalf("a full page names the next: %+v", v)
	}
	f.getJSON("/admin/api/blocked?after=order:42", &v)
	if len(v.Keys) != 0 {
		t.Fatalf("after the last key: %+v", v)
	}
	if resp, _ := f.do(req{method: "GET", path: "/admin/api/blocked?limit=0"}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("limit=0: %d", resp.StatusCode)
	}
	resp, body := f.do(req{method: "GET", path: "/admin/blocked"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "order:42") || !strings.Contains(body, dead) || !strings.Contains(body, `name="csrf_token" value="`+f.token+`"`) {
		t.Fatalf("page: %d %s", resp.StatusCode, body)
	}

	// Without the token: refused, nothing skipped.
	resp, _ = f.do(req{method: "POST", path: "/admin/api/dead/skip", form: url.Values{"id": {dead}}, header: http.Header{"Origin": {f.srv.URL}, "Sec-Fetch-Site": {"same-origin"}}})
	if resp.StatusCode != http.StatusForbidden || f.deliveryStatus(dead, "ledger") != outbox.StatusDead {
		t.Fatalf("skip without CSRF token: %d", resp.StatusCode)
	}
	if resp, _ := f.post("/admin/api/dead/skip", nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("skip without id: %d", resp.StatusCode)
	}
	// The page asks to confirm first, changing nothing.
	resp, body = f.post("/admin/blocked/skip", url.Values{"id": {dead}})
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `name="confirm" value="1"`) || !strings.Contains(body, dead) {
		t.Fatalf("skip without confirm: %d %s", resp.StatusCode, body)
	}
	if f.deliveryStatus(dead, "ledger") != outbox.StatusDead || len(f.audit.records("admin: audit")) != 0 {
		t.Fatal("the unconfirmed skip changed something")
	}
	resp, _ = f.post("/admin/blocked/skip", url.Values{"id": {dead}, "confirm": {"1"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/admin/blocked?notice=Skipped") {
		t.Fatalf("confirmed skip: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	select {
	case id := <-got:
		if id != next {
			t.Fatalf("ledger delivered %s, want the waiting event %s", id, next)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting event was not delivered after the skip")
	}
	if st := f.deliveryStatus(dead, "ledger"); st != outbox.StatusDone {
		t.Fatalf("skipped delivery is %v, want done", st)
	}
	f.getJSON("/admin/api/blocked", &v)
	if len(v.Keys) != 0 {
		t.Fatalf("still blocked: %+v", v)
	}
	recs := f.audit.records("admin: audit")
	if len(recs) != 1 || recs[0]["action"] != "skip" || recs[0]["who"] != "token" || numString(recs[0]["count"]) == "0" {
		t.Fatalf("audit: %v", recs)
	}
	// The API skip of an event that is no longer dead changes nothing.
	var out struct{ Count int }
	resp, body = f.post("/admin/api/dead/skip", url.Values{"id": {dead}})
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || out.Count != 0 {
		t.Fatalf("second skip: %d %s", resp.StatusCode, body)
	}
}

// A subscription's rate limit shows on the list and in the API; the
// others have none.
func TestSubscriptionRateShown(t *testing.T) {
	f := newFixture(t, admin.Config{}, func(*fixture) outbox.Subscription {
		return outbox.Subscription{Name: "partner", Rate: 250, Handler: func(context.Context, outbox.Event) error { return nil }}
	})
	_, page := f.do(req{method: "GET", path: "/admin/"})
	if !strings.Contains(page, `<span class="rate">at most 250/s</span>`) || strings.Count(page, `class="rate"`) != 1 {
		t.Errorf("the list does not show partner's rate, or shows one for another subscription:\n%s", page)
	}
	var subs struct{ Subscriptions []admin.Subscription }
	f.getJSON("/admin/api/subscriptions", &subs)
	for _, s := range subs.Subscriptions {
		if want := map[string]float64{"partner": 250}[s.Name]; s.Rate != want {
			t.Errorf("API: %s has rate %v; want %v", s.Name, s.Rate, want)
		}
	}
}
