package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

var update = flag.Bool("update", false, "rewrite the outputs in README.md with what the service answers")

// readmeBaseURL is the address the README's curls use.
const readmeBaseURL = "localhost:8080"

// command is one "$ ..." line of a console block in the README, with the
// output printed below it.
type command struct {
	line     int    // 1-based line number of the command in README.md
	text     string // without "$ ", continuation lines joined
	want     string // the expected output, lines joined with "\n"
	from, to int    // the output's line range [from, to) in README.md, 0-based
}

// readmeCommands returns the commands of the ```console blocks of the
// README, in order.
func readmeCommands(t *testing.T, lines []string) []command {
	t.Helper()
	var cmds []command
	in := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case !in && strings.TrimSpace(l) == "```console":
			in = true
		case in && strings.TrimSpace(l) == "```":
			in = false
			if n := len(cmds); n > 0 && cmds[n-1].to < 0 {
				cmds[n-1].to = i
			}
		case in && strings.HasPrefix(l, "$ "):
			if n := len(cmds); n > 0 && cmds[n-1].to < 0 {
				cmds[n-1].to = i
			}
			c := command{line: i + 1, text: strings.TrimPrefix(l, "$ "), to: -1}
			for strings.HasSuffix(c.text, `\`) && i+1 < len(lines) {
				i++
				c.text = strings.TrimSuffix(c.text, `\`) + " " + strings.TrimSpace(lines[i])
			}
			c.from = i + 1
			cmds = append(cmds, c)
		case in && len(cmds) == 0:
			t.Fatalf("README.md:%d: a console block must start with a \"$ \" command", i+1)
		}
	}
	if in {
		t.Fatal("README.md: unterminated console block")
	}
	for i := range cmds {
		cmds[i].want = strings.Join(lines[cmds[i].from:cmds[i].to], "\n")
	}
	return cmds
}

// TestREADMEWalkthrough runs every command of README.md's console blocks
// against the service and compares what it prints with what the README
// says, so that the walkthrough cannot rot. Run it with -update to rewrite
// the README's outputs after a deliberate change.
func TestREADMEWalkthrough(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name) // skips or fails, as testdb says, if the server is absent
			dsn := ""
			switch name {
			case "mysql":
				dsn = testdb.MySQLDSN()
			case "postgres":
				dsn = testdb.PostgresDSN()
			}
			db.Close() // the app opens its own
			walkthrough(t, dsn, *update && name == "sqlite")
		})
	}
}

func walkthrough(t *testing.T, dsn string, rewrite bool) {
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	cmds := readmeCommands(t, lines)
	if len(cmds) < 8 {
		t.Fatalf("README.md has %d console commands; the walkthrough needs create, read, list, cancel twice, a bad request, stats and metrics", len(cmds))
	}

	h := startTestApp(t, dsn)
	delta := 0 // lines added to the README by rewriting earlier outputs
	for _, c := range cmds {
		var got string
		switch {
		case c.text == "make run":
			// make echoes the recipe, then the program prints its banner.
			var b bytes.Buffer
			b.WriteString(makeRecipe(t, "run"))
			cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			d, err := parseDSN(cfg.DSN, cfg.DataDir)
			if err != nil {
				t.Fatal(err)
			}
			addr, err := net.ResolveTCPAddr("tcp", cfg.Addr)
			if err != nil {
				t.Fatal(err)
			}
			banner(&b, d.display, addr)
			got = b.String()
		case strings.HasPrefix(c.text, "curl "):
			h.waitDelivered(t)
			got = h.curl(t, c)
		default:
			t.Fatalf("README.md:%d: the walkthrough test does not know how to run %q; only make run and curl (optionally piped to grep) are replayed", c.line, c.text)
		}
		got = strings.TrimSuffix(got, "\n")
		if got != c.want {
			if rewrite {
				var repl []string
				if got != "" {
					repl = strings.Split(got, "\n")
				}
				lines = append(lines[:c.from+delta], append(repl, lines[c.to+delta:]...)...)
				delta += len(repl) - (c.to - c.from)
				continue
			}
			t.Errorf("README.md:%d: $ %s\n--- README says:\n%s\n--- the service answers:\n%s\n(run go test ./demo/restapi -run Walkthrough/sqlite -update to rewrite the README)", c.line, c.text, c.want, got)
		}
	}
	if rewrite {
		if err := os.WriteFile("README.md", []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("README.md rewritten; review the diff")
	}
}

// makeRecipe returns the command lines of target in the root Makefile as
// make echoes them, with $(GO) expanded to its default.
func makeRecipe(t *testing.T, target string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	in := false
	for l := range strings.Lines(string(src)) {
		switch {
		case strings.HasPrefix(l, target+":"):
			in = true
		case in && strings.HasPrefix(l, "\t"):
			cmd := strings.TrimPrefix(l, "\t")
			if !strings.HasPrefix(cmd, "@") {
				out.WriteString(strings.ReplaceAll(cmd, "$(GO)", "go"))
			}
		case in:
			in = false
		}
	}
	if out.Len() == 0 {
		t.Fatalf("the Makefile has no %s target with a recipe", target)
	}
	return out.String()
}

// testApp is the service under test, served by httptest, with a hook that
// tells when the outbox marked events delivered.
type testApp struct {
	*app
	rec      *outboxtest.Recorder // every event the app published and delivered
	srv      *httptest.Server
	marked   chan struct{} // a MarkDone happened; capacity 1
	stepping *steppingClock
}

// startTestApp starts the service on a fresh database: dsn, or SQLite in a
// temporary directory; on a shared server its tables have unique names and
// are dropped at the end.
func startTestApp(t *testing.T, dsn string) *testApp {
	t.Helper()
	return startTestAppWith(t, dsn, nil)
}

// startTestAppWith is startTestApp with options changed by mod first.
func startTestAppWith(t *testing.T, dsn string, mod func(*appOptions)) *testApp {
	t.Helper()
	cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DSN, cfg.DataDir = dsn, t.TempDir()
	h := &testApp{marked: make(chan struct{}, 1), stepping: newSteppingClock()}
	opts := appOptions{
		config:      cfg,
		logger:      slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		now:         h.stepping.now,
		ordersTable: testdb.TableName("orders"),
		outboxTable: testdb.TableName("outbox"),
		wrapStore: func(s driver.Store) driver.Store {
			return &signallingStore{Store: s.(*sqlstore.Store), marked: h.marked}
		},
	}
	if mod != nil {
		mod(&opts)
	}
	ctx := context.Background()
	a, err := newApp(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.app = a
	t.Cleanup(func() {
		h.srv.Close()
		if dsn != "" {
			testdb.DropTable(t, a.db, a.orders.table, a.store.Table(), a.store.SchemaTable())
		}
		if err := a.close(ctx); err != nil {
			t.Error(err)
		}
	})
	h.rec = outboxtest.Record(a.ob, "test-recorder")
	a.start(ctx)
	h.srv = httptest.NewServer(a.handler)
	return h
}

// waitDelivered waits until the outbox table holds no undelivered event:
// every event committed so far has been through its listeners and the
// metrics. It wakes on each MarkDone instead of sleeping.
func (h *testApp) waitDelivered(t *testing.T) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		s, err := h.store.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s.Pending() == 0 {
			return
		}
		select {
		case <-h.marked:
		case <-deadline:
			t.Fatalf("events still undelivered after 30s: %+v", s)
		}
	}
}

// curl runs a README curl command, optionally piped to grep, against the
// test server and returns what curl would print.
func (h *testApp) curl(t *testing.T, c command) string {
	t.Helper()
	pipeline := splitPipes(shellWords(t, c))
	args := pipeline[0]
	method, url, body := "", "", ""
	hasBody := false
	header := http.Header{}
	for i := 1; i < len(args); i++ {
		switch a := args[i]; a {
		case "-s", "--silent", "-sS":
		case "-X", "--request":
			i++
			method = args[i]
		case "-d", "--data", "--data-raw":
			i++
			body, hasBody = args[i], true
		case "-H", "--header":
			i++
			k, v, _ := strings.Cut(args[i], ":")
			header.Add(k, strings.TrimSpace(v))
		default:
			if strings.HasPrefix(a, "-") {
				t.Fatalf("README.md:%d: the walkthrough test does not know curl option %s", c.line, a)
			}
			url = a
		}
	}
	rest, ok := strings.CutPrefix(url, readmeBaseURL)
	if !ok {
		t.Fatalf("README.md:%d: curl URL %q does not start with %s", c.line, url, readmeBaseURL)
	}
	if method == "" {
		method = http.MethodGet
		if hasBody {
			method = http.MethodPost
		}
	}
	var rd io.Reader
	if hasBody {
		rd = strings.NewReader(body)
		header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
	}
	req, err := http.NewRequest(method, h.srv.URL+rest, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pipeline[1:] {
		out = grep(t, c, p, out)
	}
	return string(out)
}

// grep applies "grep [-E] PATTERN" to out.
func grep(t *testing.T, c command, args []string, out []byte) []byte {
	if len(args) < 2 || args[0] != "grep" || (len(args) == 3 && args[1] != "-E") || len(args) > 3 {
		t.Fatalf("README.md:%d: only `grep [-E] PATTERN` may follow a pipe, not %q", c.line, args)
	}
	re := regexp.MustCompile(args[len(args)-1])
	var b bytes.Buffer
	for l := range strings.Lines(string(out)) {
		if re.MatchString(strings.TrimSuffix(l, "\n")) {
			b.WriteString(l)
		}
	}
	return b.Bytes()
}

// shellWords splits a command line as a POSIX shell would for the quoting
// the README uses: single quotes, double quotes, backslash escapes, and |
// as its own word.
func shellWords(t *testing.T, c command) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	s := c.text
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				t.Fatalf("README.md:%d: unbalanced single quote", c.line)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case ch == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(`"\$`+"`", s[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(s[i])
			}
			if i == len(s) {
				t.Fatalf("README.md:%d: unbalanced double quote", c.line)
			}
			inWord = true
		case ch == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case ch == ' ' || ch == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case ch == '|':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			words = append(words, "|")
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

func splitPipes(words []string) [][]string {
	out := [][]string{nil}
	for _, w := range words {
		if w == "|" {
			out = append(out, nil)
			continue
		}
		out[len(out)-1] = append(out[len(out)-1], w)
	}
	return out
}

// steppingClock starts at a fixed time and moves 2.5 s at each reading,
// so that the README shows plausible, distinct times.
type steppingClock struct {
	mu sync.Mutex
	t  time.Time
}

func newSteppingClock() *steppingClock {
	return &steppingClock{t: time.Date(2026, 5, 4, 9, 30, 0, 123456000, time.UTC)}
}

func (c *steppingClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.t
	c.t = c.t.Add(2500 * time.Millisecond)
	return t
}

// signallingStore tells the test when the engine marked events done.
type signallingStore struct {
	*sqlstore.Store
	marked chan struct{}
}

func (s *signallingStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	n, err := s.Store.MarkDone(ctx, owner, ids, registry)
	select {
	case s.marked <- struct{}{}:
	default:
	}
	return n, err
}

// MarkDoneKeys is MarkDone for batches with ordered events (the engine
// calls it instead of MarkDone then).
func (s *signallingStore) MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []driver.KeyDone, registry int64) (int, []string, error) {
	n, later, err := s.Store.MarkDoneKeys(ctx, owner, ids, evs, registry)
	select {
	case s.marked <- struct{}{}:
	default:
	}
	return n, later, err
}

// testWriter sends the service's warnings and errors to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestREADMEConfigTable checks that the README's configuration table lists
// every flag with its environment variable and default, and nothing else.
func TestREADMEConfigTable(t *testing.T) {
	src, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `-([a-z-]+)` \\| `([A-Z_]+)` \\| ([^|]*) \\|")
	documented := map[string][2]string{}
	for l := range strings.Lines(string(src)) {
		if m := row.FindStringSubmatch(l); m != nil {
			documented[m[1]] = [2]string{m[2], strings.TrimSpace(m[3])}
		}
	}
	var c config
	defs := flagDefs(&c)
	if len(documented) != len(defs) {
		t.Errorf("README documents %d flags, the demo has %d", len(documented), len(defs))
	}
	for _, d := range defs {
		doc, ok := documented[d.name]
		switch {
		case !ok:
			t.Errorf("README does not document -%s", d.name)
		case doc[0] != d.env:
			t.Errorf("README: -%s reads %s, but the demo reads %s", d.name, doc[0], d.env)
		case d.def != "" && !strings.HasPrefix(doc[1], "`"+d.def+"`"):
			t.Errorf("README: -%s defaults to %s, but the demo to %q", d.name, doc[1], d.def)
		}
	}
}
