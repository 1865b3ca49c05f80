package admin_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// Without Config.Inbox the inbox routes answer 404.
func TestInboxAPIWithoutInbox(t *testing.T) {
	f := newFixture(t, admin.Config{})
	if resp, body := f.do(req{method: "GET", path: "/admin/api/inbox"}); resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "Config.Inbox") {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}
