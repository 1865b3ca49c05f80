package browsertest_test

import (
	"context"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

const token = "browser-test-token"

// chromium returns the browser to drive: $TXOUTBOX_CHROMIUM if set, else
// /usr/bin/chromium or one on the PATH. Without one the test skips, and
// fails in CI (TXOUTBOX_REQUIRE_DB set: .ci/run installs chromium).
func chromium(t *testing.T) string {
	names := []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"}
	if p := os.Getenv("TXOUTBOX_CHROMIUM"); p != "" {
		names = []string{p}
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium found (apt-get install chromium chromium-driver, or set TXOUTBOX_CHROMIUM)"
	if os.Getenv("TXOUTBOX_REQUIRE_DB") != "" {
		t.Fatalf("%s; TXOUTBOX_REQUIRE_DB is set, so this fails instead of skipping", msg)
	}
	t.Skip(msg)
	return ""
}

// screenshotDir is where the screenshots go: $TXOUTBOX_SCREENSHOT_DIR, or
// a new temporary directory that outlives the test.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("TXOUTBOX_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d, err := os.MkdirTemp("", "txoutbox-admin-screenshots-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The admin page in a real browser: it shows a dead letter the test
// made; replaying it through the page (dry run, then confirm) delivers
// it; a subscription is paused and resumed with its buttons; a forged
// cross-site form POST, sent with the browser's credentials, is refused.
// Screenshots of the pages are saved and their paths logged.
func TestAdminInBrowser(t *testing.T) {
	exe := chromium(t)
	ctx := context.Background()

	// An outbox on SQLite: mailer fails permanently at its first call
	// (the event goes dead for it), then delivers; search always delivers.
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	ob, err := outbox.New(store, outbox.Config{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	delivered := make(chan string, 1)
	ob.Handle("mailer", func(ctx context.Context, ev outbox.Event) error {
		if calls.Add(1) == 1 {
			return outbox.Permanent(errors.New("smtp: 550 mailbox unavailable"))
		}
		delivered <- ev.ID
		return nil
	}, "order.placed")
	ob.Handle("search", func(context.Context, outbox.Event) error { return nil })
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close(context.Background()) })

	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "order.placed", AggregateType: "order", AggregateID: "1042", JSON: []byte(`{"email":"ada@example.com"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the dead letter", func() bool { return deliveryStatus(ob, id, "mailer") == outbox.StatusDead })

	var audit syncBuffer
	h, err := admin.New(ob, admin.Config{Authorize: admin.Token(token), BasePath: "/admin", Store: store, Logger: slog.New(slog.NewTextHandler(&audit, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + "/admin"

	// The browser: headless Chromium with a fresh profile, sending the
	// token with every request (as a browser sends its cookies or Basic
	// credentials), to every site.
	actx, cancel := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			t.Fatalf("%s: %v\naudit log:\n%s", what, err, audit.String())
		}
	}
	shots := screenshotDir(t)
	screenshot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(shots, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", path, len(png))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	if _, err := chromedp.Call(bctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("start the browser: %v", err)
	}
	if _, err := chromedp.Call(bctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer " + token}}); err != nil {
		t.Fatal(err)
	}

	// The subscriptions, with mailer's dead letter counted.
	do("open the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#sub-mailer")))
	if got := text("#sub-mailer a.dead-count"); got != "1" {
		t.Fatalf("mailer's dead count on the page: %q; want 1", got)
	}
	// The dead letter, in the list.
	do("open the dead letters", chromedp.Click(chromedp.CSS("#sub-mailer a.dead-count")), chromedp.WaitVisible(chromedp.CSS("tr.letter")))
	if row := text("tr.letter"); !strings.Contains(row, id) || !strings.Contains(row, "mailer") || !strings.Contains(row, "smtp: 550 mailbox unavailable") {
		t.Fatalf("the dead letter row: %q", row)
	}
	screenshot("admin-dead.png")
	// Replay: the dry run counts, the confirmation replays.
	do("dry run", chromedp.Click(chromedp.CSS("#replay")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if got := text("#count"); !strings.Contains(got, "Dry run: 1 dead letter matches") {
		t.Fatalf("the dry run says %q", got)
	}
	if deliveryStatus(ob, id, "mailer") != outbox.StatusDead {
		t.Fatal("the dry run changed the dead letter")
	}
	do("confirm", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#notice")), chromedp.WaitVisible(chromedp.CSS("#no-dead")))
	if got := text("#notice"); got != "Replayed 1 dead letter" {
		t.Fatalf("after the confirmation the page says %q", got)
	}
	select {
	case got := <-delivered:
		if got != id {
			t.Fatalf("delivered %s; want %s", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the replayed event was not delivered")
	}
	waitFor(t, "the replayed delivery's record", func() bool { return deliveryStatus(ob, id, "mailer") == outbox.StatusDone })
	// The event, looked up through the header's form: delivered, with the
	// failed attempt in mailer's history.
	do("look up the event", chromedp.Navigate(base+"/"), chromedp.SendKeys(chromedp.CSS(`input[name="id"]`), id), chromedp.Submit(chromedp.CSS(`input[name="id"]`)), chromedp.WaitVisible(chromedp.CSS("#delivery-mailer")))
	if got := text("#delivery-mailer .status"); got != "done" {
		t.Fatalf("mailer's delivery on the event page: %q; want done", got)
	}
	if got := text("#delivery-mailer ol.history"); !strings.Contains(got, "smtp: 550 mailbox unavailable") {
		t.Fatalf("mailer's history: %q", got)
	}
	screenshot("admin-event.png")

	// Pause and resume search with its buttons.
	do("pause", chromedp.Navigate(base+"/"), chromedp.Click(chromedp.CSS("#sub-search button.pause")), chromedp.WaitVisible(chromedp.CSS("#sub-search button.resume")))
	if got, st := text("#notice"), text("#sub-search .state"); got != "Paused search" || st != "paused" || !paused(ob, "search") {
		t.Fatalf("after pause: notice %q, state %q, paused %v", got, st, paused(ob, "search"))
	}
	screenshot("admin.png")
	do("resume", chromedp.Click(chromedp.CSS("#sub-search button.resume")), chromedp.WaitVisible(chromedp.CSS("#sub-search button.pause")))
	if got, st := text("#notice"), text("#sub-search .state"); got != "Resumed search" || st != "active" || paused(ob, "search") {
		t.Fatalf("after resume: notice %q, state %q, paused %v", got, st, paused(ob, "search"))
	}

	// A forged cross-site POST: another site's page holds a form that
	// pauses search, even with a valid CSRF token (as if it had leaked);
	// the browser sends it with its credentials, and the admin refuses it
	// for its origin.
	attr, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.CSS(`#sub-search input[name="csrf_token"]`), "value"))
	if err != nil || attr.Value == "" {
		t.Fatalf("read the token: %v", err)
	}
	csrf := attr.Value
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>win a prize</title><form method="post" action="%s/subscriptions/search/pause"><input type="hidden" name="csrf_token" value="%s"><button id="go">Claim</button></form>`, html.EscapeString(base), html.EscapeString(csrf))
	}))
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1) // another site, not only another port
	do("forged POST", chromedp.Navigate(evilURL), chromedp.Click(chromedp.CSS("#go")), chromedp.WaitVisible(chromedp.CSS("#error")))
	body := text("#error")
	if !strings.Contains(body, "cross-origin request rejected") || paused(ob, "search") {
		t.Fatalf("the forged POST: page %q, search paused %v", body, paused(ob, "search"))
	}
	if log := audit.String(); !strings.Contains(log, `msg="admin: request rejected"`) || !strings.Contains(log, "sec_fetch_site=cross-site") {
		t.Fatalf("the audit log does not record the forged POST:\n%s", log)
	}
	t.Logf("audit log:\n%s", audit.String())
}

func deliveryStatus(ob *outbox.Outbox, id, sub string) outbox.Status {
	rec, err := ob.Inspect(context.Background(), id)
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

func paused(ob *outbox.Outbox, name string) bool {
	for _, s := range ob.Subscriptions() {
		if s.Name == name {
			return s.Paused
		}
	}
	return false
}

// waitFor polls cond: the engine records outcomes asynchronously and
// offers no signal for "written".
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	sb strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sb.String()
}
