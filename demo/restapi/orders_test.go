package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// do sends a request to the test app and returns the status and body.
func (h *testApp) do(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// rows counts the orders and the outbox rows.
func (h *testApp) rows(t *testing.T) (orders, events int) {
	t.Helper()
	if err := h.db.Get(&orders, "SELECT COUNT(*) FROM "+h.orders.table); err != nil {
		t.Fatal(err)
	}
	if err := h.db.Get(&events, "SELECT COUNT(*) FROM "+h.store.Table()); err != nil {
		t.Fatal(err)
	}
	return orders, events
}

const validOrder = `{"customer":"ada","items":[{"sku":"book","qty":2,"price_cents":1250}]}`

func TestBadBodyIs400AndWritesNothing(t *testing.T) {
	h := startTestApp(t, "")
	for name, tc := range map[string]struct{ body, detail string }{
		"empty":          {"", "body is empty"},
		"not JSON":       {`{"customer":`, "body is not valid JSON"},
		"not an object":  {`[1,2]`, "body must be a JSON object, not array"},
		"unknown field":  {`{"customer":"ada","itmes":[]}`, `unknown field "itmes"`},
		"trailing data":  {validOrder + `{}`, "body must be a single JSON object"},
		"wrong type":     {`{"customer":"ada","items":[{"sku":"b","qty":"2"}]}`, "items.qty must be a number, not a JSON string"},
		"no items":       {`{"customer":"ada","items":[]}`, "items: at least one item is required"},
		"blank customer": {`{"customer":"  ","items":[{"sku":"b","qty":1}]}`, "customer is required"},
		"negative price": {`{"customer":"ada","items":[{"sku":"b","qty":1,"price_cents":-1}]}`, "items[0].price_cents must be between 0 and 100000000"},
		"too large":      {`{"customer":"` + strings.Repeat("a", maxBodyBytes) + `"}`, "body is over 65536 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := h.do(t, http.MethodPost, "/orders", tc.body)
			var p struct {
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}
			if err := json.Unmarshal([]byte(body), &p); err != nil {
				t.Fatalf("body %q is not a problem document: %v", body, err)
			}
			if status != http.StatusBadRequest || p.Status != http.StatusBadRequest || !strings.Contains(p.Detail, tc.detail) {
				t.Errorf("got %d %q, want 400 with a detail containing %q", status, p.Detail, tc.detail)
			}
		})
	}
	if o, e := h.rows(t); o != 0 || e != 0 {
		t.Errorf("after bad requests: %d orders and %d outbox rows, want none", o, e)
	}
	if n, err := testutil.GatherAndCount(h.reg, "txoutbox_events_published_total"); err != nil || n != 0 {
		t.Errorf("events_published_total has %d series (%v), want none: nothing was published", n, err)
	}
}

func TestSecondCancelIs409AndPublishesNothing(t *testing.T) {
	h := startTestApp(t, "")
	if status, body := h.do(t, http.MethodPost, "/orders", validOrder); status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	if status, body := h.do(t, http.MethodPost, "/orders/1/cancel", ""); status != http.StatusOK || !strings.Contains(body, `"status": "cancelled"`) {
		t.Fatalf("first cancel: %d %s", status, body)
	}
	h.waitDelivered(t)
	_, before := h.rows(t)

	status, body := h.do(t, http.MethodPost, "/orders/1/cancel", "")
	if status != http.StatusConflict || !strings.Contains(body, "order 1 is already cancelled") {
		t.Errorf("second cancel: %d %s, want 409 already cancelled", status, body)
	}
	if _, after := h.rows(t); after != before {
		t.Errorf("outbox rows: %d before the second cancel, %d after; want no new event", before, after)
	}
	h.waitDelivered(t)
	h.model.mu.Lock()
	got := h.model.delivered[OrderCancelled]
	h.model.mu.Unlock()
	if got != 1 {
		t.Errorf("OrderCancelled delivered %d times, want 1", got)
	}
	if status, _ := h.do(t, http.MethodPost, "/orders/9/cancel", ""); status != http.StatusNotFound {
		t.Errorf("cancel of a missing order: %d, want 404", status)
	}
}

func TestGetAndListOrders(t *testing.T) {
	h := startTestApp(t, "")
	for range 3 {
		if status, body := h.do(t, http.MethodPost, "/orders", validOrder); status != http.StatusCreated {
			t.Fatalf("create: %d %s", status, body)
		}
	}
	for path, want := range map[string]int{
		"/orders/2": http.StatusOK, "/orders/4": http.StatusNotFound, "/orders/abc": http.StatusNotFound,
		"/orders?limit=0": http.StatusBadRequest, "/nowhere": http.StatusNotFound,
	} {
		if status, body := h.do(t, http.MethodGet, path, ""); status != want {
			t.Errorf("GET %s: %d %s, want %d", path, status, body, want)
		}
	}
	var page orderPage
	_, body := h.do(t, http.MethodGet, "/orders?limit=2", "")
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Orders) != 2 || page.Next != "/orders?after=2&limit=2" {
		t.Fatalf("first page: %d orders, next %q", len(page.Orders), page.Next)
	}
	_, body = h.do(t, http.MethodGet, page.Next, "")
	page = orderPage{}
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Orders) != 1 || page.Orders[0].ID != 3 || page.Next != "" {
		t.Errorf("second page: %+v", page)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	h := startTestApp(t, "")
	for path, want := range map[string]string{"/healthz": "ok\n", "/readyz": "ready\n"} {
		if status, body := h.do(t, http.MethodGet, path, ""); status != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, status, body, want)
		}
	}
	// /livez is the engine's liveness (outbox.Health as JSON).
	status, body := h.do(t, http.MethodGet, "/livez", "")
	var live outbox.HealthStatus
	if err := json.Unmarshal([]byte(body), &live); err != nil || status != http.StatusOK || !live.Live || len(live.Checks) == 0 {
		t.Errorf("GET /livez: %d %s (%v), want 200 and live checks", status, body, err)
	}
	// /readyz fails with the outbox: closed, it is not ready.
	if err := h.ob.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if status, body := h.do(t, http.MethodGet, "/readyz", ""); status != http.StatusServiceUnavailable || !strings.Contains(body, "running") {
		t.Errorf("GET /readyz with the outbox closed: %d %q, want 503 naming the check \"running\"", status, body)
	}
	h.ready.Store(false) // what shutdown does first
	if status, _ := h.do(t, http.MethodGet, "/readyz", ""); status != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz while shutting down: %d, want 503", status)
	}
}

// TestRunServesAndDrainsOnShutdown runs the program as main does, on a
// SQLite file, places an order, stops it the way SIGTERM does, and checks
// that it exits cleanly with the event delivered and nothing pending.
func TestRunServesAndDrainsOnShutdown(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"DATA_DIR": dir}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, func(k string) string { return env[k] }, pw, log)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	if !sc.Scan() {
		t.Fatalf("no banner; run returned %v", <-done)
	}
	first := sc.Text()
	go io.Copy(io.Discard, pr) // the rest of the banner
	_, rest, ok := strings.Cut(first, "listening on ")
	base, _, _ := strings.Cut(rest, " ")
	if !ok || !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("banner %q does not say where it listens", first)
	}
	if !strings.Contains(first, "sqlite "+filepath.Join(dir, sqliteFile)) {
		t.Errorf("banner %q does not name the database", first)
	}
	resp, err := http.Post(base+"/orders", "application/json", strings.NewReader(validOrder))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}

	cancel() // as SIGINT/SIGTERM would
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	db := sqlx.MustOpen("sqlite", sqliteDSN(filepath.Join(dir, sqliteFile)))
	defer db.Close()
	s, err := sqlstore.Must(sqlstore.New(db, sqlstore.Options{})).Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending() != 0 || s.Done != 1 {
		t.Errorf("after shutdown: %+v, want the one event done and nothing pending", s)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the server still answers after run returned")
	}
}

func TestParseConfigFlagsOverEnvironment(t *testing.T) {
	env := map[string]string{"ADDR": ":9000", "DATABASE_URL": "sqlite:x.db", "POLL_INTERVAL": "2s", "RETENTION": "24h"}
	c, err := parseConfig([]string{"-addr", ":9001"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != ":9001" || c.DSN != "sqlite:x.db" || c.PollInterval.String() != "2s" || c.DataDir != "data" || c.Retention != 24*time.Hour {
		t.Errorf("config %+v", c)
	}
	if c, err := parseConfig(nil, func(string) string { return "" }, io.Discard); err != nil || c.Retention != 7*24*time.Hour {
		t.Errorf("default retention %v (err %v), want a week", c.Retention, err)
	}
	for _, bad := range [][]string{{"-poll-interval", "0s"}, {"extra"}, {"-nope"}} {
		if _, err := parseConfig(bad, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("parseConfig(%q) = nil error", bad)
		}
	}
	if _, err := parseConfig(nil, func(k string) string { return map[string]string{"STATS_INTERVAL": "soon"}[k] }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "STATS_INTERVAL") {
		t.Errorf("a bad STATS_INTERVAL: err = %v, want one naming the variable", err)
	}
}

func TestParseDSN(t *testing.T) {
	for _, tc := range []struct{ dsn, driver, dialect, display, contains string }{
		{"", "sqlite", "sqlite", "sqlite " + filepath.Join("d", sqliteFile), "file:" + filepath.Join("d", sqliteFile)},
		{"sqlite:/tmp/x.db", "sqlite", "sqlite", "sqlite /tmp/x.db", "_txlock=immediate"},
		{"mysql://u:secret@db:3307/shop", "mysql", "mysql", "mysql u@db:3307/shop", "u:secret@tcp(db:3307)/shop?"},
		{"mysql://u:secret@db/shop?timeout=5s", "mysql", "mysql", "mysql u@db:3306/shop", "timeout=5s"},
		{"u:secret@tcp(127.0.0.1:3306)/test", "mysql", "mysql", "mysql u@127.0.0.1:3306/test", "parseTime=true"},
		{"postgres://pg:secret@h:5432/test?sslmode=disable", "pgx", "postgres", "postgres pg@h:5432/test", "sslmode=disable"},
	} {
		d, err := parseDSN(tc.dsn, "d")
		if err != nil {
			t.Errorf("parseDSN(%q): %v", tc.dsn, err)
			continue
		}
		if d.driver != tc.driver || d.dialect != tc.dialect || d.display != tc.display || !strings.Contains(d.dsn, tc.contains) {
			t.Errorf("parseDSN(%q) = %+v; want driver %s, dialect %s, display %q, a DSN containing %q", tc.dsn, d, tc.driver, tc.dialect, tc.display, tc.contains)
		}
		if strings.Contains(d.display, "secret") {
			t.Errorf("parseDSN(%q): display %q shows the password", tc.dsn, d.display)
		}
		if tc.driver == "mysql" && (!strings.Contains(d.dsn, "interpolateParams=true") || !strings.Contains(d.dsn, "parseTime=true")) {
			t.Errorf("parseDSN(%q): mysql DSN %q lacks parseTime or interpolateParams", tc.dsn, d.dsn)
		}
	}
	for _, bad := range []string{"oracle://u:secret@h/db", "sqlite:", "mysql://u:secret@/x", "whatever secret"} {
		_, err := parseDSN(bad, "d")
		if err == nil || strings.Contains(err.Error(), "secret") || !errors.Is(err, errDSN) {
			t.Errorf("parseDSN(%q): err = %v; want errDSN, without the password", bad, err)
		}
	}
}

func TestMain(m *testing.M) { leakcheck.Main(m) }

// An address in use fails at once with an error that names -addr and
// ADDR, before the database is opened or the outbox started (nothing is
// logged, nothing is created).
func TestAddressInUseNamesTheFix(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	err = run(context.Background(), []string{"-addr", ln.Addr().String()}, func(k string) string { return map[string]string{"DATA_DIR": dir}[k] }, io.Discard, log)
	if err == nil {
		t.Fatal("run on a taken address succeeded")
	}
	for _, want := range []string{ln.Addr().String(), "-addr", "ADDR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if logs.Len() != 0 {
		t.Errorf("logged before failing:\n%s", logs.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("created %d files in the data directory before failing", len(entries))
	}
}

// What requests publish, seen through outboxtest's recorder: a created
// order publishes one OrderPlaced about it; a rejected request and a
// second cancel (rolled back) publish nothing.
func TestRequestsPublishWhatTheyShould(t *testing.T) {
	h := startTestApp(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if status, body := h.do(t, http.MethodPost, "/orders", validOrder); status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	evs, err := h.rec.WaitFor(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ev := evs[0]; ev.Type != OrderPlaced || ev.AggregateType != "order" || ev.AggregateID != "1" {
		t.Fatalf("published %s about %s %s; want OrderPlaced about order 1", ev.Type, ev.AggregateType, ev.AggregateID)
	}
	if status, _ := h.do(t, http.MethodPost, "/orders", `{"customer":""}`); status != http.StatusBadRequest {
		t.Fatalf("bad order: %d, want 400", status)
	}
	if status, _ := h.do(t, http.MethodPost, "/orders/1/cancel", ""); status != http.StatusOK {
		t.Fatalf("cancel: %d", status)
	}
	if status, _ := h.do(t, http.MethodPost, "/orders/1/cancel", ""); status != http.StatusConflict {
		t.Fatalf("second cancel: %d, want 409", status)
	}
	if _, err := h.rec.WaitFor(ctx, 2); err != nil {
		t.Fatal(err)
	}
	h.waitDelivered(t)
	if types := h.rec.Types(); len(types) != 2 || types[0] != OrderPlaced || types[1] != OrderCancelled {
		t.Fatalf("published %v; want [OrderPlaced OrderCancelled] (nothing for the 400 and the 409)", types)
	}
}

// make run builds the demo and execs it, so that Ctrl-C (SIGINT) ends it
// with its own exit status: 0 after a clean drain (go run would report
// the signal as exit 1).
func TestMakeRunExitsZeroOnInterrupt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the demo")
	}
	recipe := makeRecipe(t, "run")
	if strings.Contains(recipe, "go run") || !strings.Contains(recipe, "exec ./bin/restapi") {
		t.Fatalf("make run's recipe:\n%s\nwant a build, then exec of the binary", recipe)
	}
	bin := filepath.Join(t.TempDir(), "restapi")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATA_DIR="+t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !bufio.NewScanner(stdout).Scan() { // the banner: serving
		cmd.Process.Kill()
		t.Fatalf("no banner; %v", cmd.Wait())
	}
	go io.Copy(io.Discard, stdout)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGINT: %v; want exit status 0", err)
	}
}
