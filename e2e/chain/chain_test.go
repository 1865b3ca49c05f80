// Package chain tests the issue 36 chain under SIGKILL: service A (an
// outbox, in the test process) publishes to NATS JetStream; service B
// (serviceb, a separate process) consumes with the inbox and, in each
// message's transaction, writes an effect row and publishes an event
// through its own outbox to a webhook endpoint; that endpoint (in the
// test process) is a webhook.Receiver with an inbox of its own. B is
// killed with SIGKILL at random moments and started again; at the end
// every one of A's events must have exactly one effect row in B's
// database and exactly one at the final receiver.
package chain

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The run: kills × perKill events of A.
const (
	kills   = 25
	perKill = 12
	events  = kills * perKill
)

// serviceB is the binary built once for all tests, with buildFlags.
var (
	serviceB   string
	buildFlags []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chain-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	serviceB = filepath.Join(dir, "serviceb")
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", serviceB, "./serviceb")...)
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "go build ./serviceb:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestChainSIGKILL(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) { testChain(t, name) })
	}
}

// open opens the database name of testdb.Names, and returns the driver
// name and DSN for service B.
func open(t *testing.T, name string) (db *sqlx.DB, driver, dsn string) {
	switch name {
	case "mysql":
		return testdb.MySQL(t), "mysql", testdb.MySQLDSN()
	case "postgres":
		return testdb.Postgres(t), "pgx", testdb.PostgresDSN()
	}
	// A file both processes open, with testdb.SQLite's 30 s busy
	// timeout: B and the test write to it at once.
	dsn = sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "chain.db"))
	dsn = strings.Replace(dsn, "busy_timeout(5000)", "busy_timeout(30000)", 1)
	db, err := sqlx.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, "sqlite", dsn
}

// receiver is the final webhook endpoint: a webhook.Receiver (which
// verifies signatures and applies each webhook-id once with its inbox),
// counting the requests it gets per webhook-id.
type receiver struct {
	rc    *webhook.Receiver
	mu    sync.Mutex
	posts map[string]int // webhook-id → requests
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.posts[req.Header.Get(webhook.HeaderID)]++
	r.mu.Unlock()
	r.rc.ServeHTTP(w, req)
}

func (r *receiver) counts() (requests, ids int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.posts {
		requests += n
	}
	return requests, len(r.posts)
}

// chain is one run of the test: its database, NATS stream, receiver and
// service A, and the runs of service B.
type chain struct {
	t              *testing.T
	db             *sqlx.DB
	driver, dsn    string // for B
	natsURL        string
	js             jetstream.JetStream
	stream         string
	storeA, storeB *sqlstore.Store
	tableB         string // B's outbox table, unquoted
	effectsB       string // B's effects; the receiver's are effectsC
	effectsC       string
	final          *receiver
	url, secret    string // of the receiver
	obA            *outbox.Outbox
	idsA           []string // the events A published
	logs           string   // B's stdout and stderr, a file each per run
	runs           int
}

// durable is B's JetStream consumer.
const durable = "service-b"

func testChain(t *testing.T, name string) {
	c := newChain(t, name)
	for i := range kills {
		c.publish(perKill)
		c.killRun(i + 1)
	}
	c.settle()
	c.checkOnce()
	c.figures(name)
}

func newChain(t *testing.T, name string) *chain {
	c := &chain{t: t, natsURL: testbroker.NATS(t), logs: t.TempDir()}
	c.db, c.driver, c.dsn = open(t, name)
	ctx := context.Background()

	// Private tables: A's outbox, B's outbox (with its inbox tables) and
	// effects, the receiver's inbox tables and effects. The effects
	// tables have no unique constraint: an effect applied twice is two
	// rows.
	c.storeA = testdb.StoreWith(t, c.db, sqlstore.Options{Table: testdb.TableName("chain_a")})
	tableB := testdb.TableName("chain_b")
	c.tableB = tableB
	c.storeB = testdb.StoreWith(t, c.db, sqlstore.Options{Table: tableB})
	tableC := testdb.TableName("chain_c")
	storeC := testdb.StoreWith(t, c.db, sqlstore.Options{Table: tableC})
	c.effectsB, c.effectsC = tableB+"_effects", tableC+"_effects"
	for _, tbl := range []string{c.effectsB, c.effectsC} {
		c.db.MustExec(`CREATE TABLE ` + tbl + ` (a_id VARCHAR(64) NOT NULL)`)
	}
	t.Cleanup(func() { testdb.DropTable(t, c.db, c.effectsB, c.effectsC) })

	// NATS: a private stream and B's durable, with a short AckWait so
	// that the messages a killed B held come back within seconds.
	nc, err := nats.Connect(c.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	suffix := strings.TrimPrefix(tableB, "chain_b_")
	subject := "chain." + suffix
	c.stream = "CHAIN_" + strings.ToUpper(suffix)
	if _, err := c.js.CreateStream(ctx, jetstream.StreamConfig{Name: c.stream, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() { _ = c.js.DeleteStream(context.Background(), c.stream) })
	if _, err := c.js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 2 * time.Second}); err != nil {
		t.Fatalf("create consumer: %v", err)
	}

	c.startReceiver(storeC, tableC)
	c.startA(subject)
	return c
}

// startReceiver serves the final webhook endpoint.
func (c *chain) startReceiver(store *sqlstore.Store, table string) {
	t := c.t
	c.secret = webhook.NewSecret()
	dialect, err := inbox.DialectNamed(store.Dialect().Name())
	if err != nil {
		t.Fatal(err)
	}
	// The log lines of the receiver and its inbox (requests cut by a
	// kill of B, which B sends again) go nowhere: the figures count them.
	quiet := slog.New(slog.DiscardHandler)
	ib, err := inbox.New(c.db.DB, inbox.Config{Dialect: dialect, Table: table, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	insert := c.db.Rebind(`INSERT INTO ` + c.effectsC + ` (a_id) VALUES (?)`)
	rc, err := webhook.NewReceiver(webhook.ReceiverConfig{Inbox: ib, Name: "final", Secrets: []string{c.secret}, Logger: quiet,
		Handler: func(ctx context.Context, m inbox.Message) error {
			var body struct {
				AID string `json:"a_id"`
			}
			if err := json.Unmarshal(m.Payload, &body); err != nil || body.AID == "" {
				return fmt.Errorf("B's event %s has no a_id (%v): %q", m.ID, err, m.Payload)
			}
			_, err := inbox.Tx(ctx).ExecContext(ctx, insert, body.AID)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	c.final = &receiver{rc: rc, posts: map[string]int{}}
	srv := httptest.NewServer(c.final)
	t.Cleanup(srv.Close)
	c.url = srv.URL
}

// startA starts service A: an outbox publishing to the stream.
func (c *chain) startA(subject string) {
	t := c.t
	var err error
	c.obA, err = outbox.New(c.storeA, outbox.Config{PollInterval: 100 * time.Millisecond, PollMaxInterval: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := natsoutbox.New(c.js, natsoutbox.Config{Subject: subject + ".{type}", Stream: c.stream})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.obA.Subscribe(outbox.Subscription{Name: "to-nats", Batch: pub.Handler()}); err != nil {
		t.Fatal(err)
	}
	if err := c.obA.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.obA.Close(context.Background()) })
}

// publish publishes n events of A in one transaction.
func (c *chain) publish(n int) {
	t, ctx := c.t, context.Background()
	tx, err := outbox.BeginTx(ctx, c.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	for range n {
		id, err := c.obA.PublishTx(ctx, tx, outbox.Envelope{Type: "a.happened", JSON: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		c.idsA = append(c.idsA, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// startB starts a run of service B.
func (c *chain) startB() (cmd *exec.Cmd, ready, working <-chan struct{}) {
	t := c.t
	c.runs++
	cmd = exec.Command(serviceB)
	cmd.Env = append(os.Environ(), "CHAIN_DRIVER="+c.driver, "CHAIN_DSN="+c.dsn, "CHAIN_TABLE="+c.tableB, "CHAIN_EFFECTS="+c.effectsB,
		"CHAIN_NATS="+c.natsURL, "CHAIN_STREAM="+c.stream, "CHAIN_DURABLE="+durable,
		"CHAIN_WEBHOOK_URL="+c.url, "CHAIN_SECRET="+c.secret)
	out, err := os.Create(filepath.Join(c.logs, fmt.Sprintf("run%02d.out", c.runs)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	errf, err := os.Create(filepath.Join(c.logs, fmt.Sprintf("run%02d.err", c.runs)))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	ow := &outWriter{w: out, ready: make(chan struct{}), working: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = ow, errf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, ow.ready, ow.working
}

// killRun starts B and kills it with SIGKILL at a random moment while it
// works through the backlog (the events just published and those a
// previous run left): killing then is the point.
func (c *chain) killRun(kill int) {
	t := c.t
	cmd, _, working := c.startB()
	select {
	case <-working:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		t.Fatalf("run %d of service B handled nothing within 30 s: %s", c.runs, c.stderr(c.runs))
	}
	time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", kill, err)
	}
	_ = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("run %d of service B ended on its own (%v), not by the SIGKILL: %s", c.runs, cmd.ProcessState, c.stderr(c.runs))
	}
}

// settle runs B a last time until the chain is quiet: A's outbox has
// delivered everything to the stream, B's durable has no message
// pending or unacked (B acks after its commit, so B's events are
// written), and B's outbox has delivered everything to the receiver
// (2xx: after the receiver's commit). Nothing can arrive after that.
// Then it stops B with SIGTERM.
func (c *chain) settle() {
	t, ctx := c.t, context.Background()
	cmd, ready, _ := c.startB()
	var openA, openB int
	var info *jetstream.ConsumerInfo
	quiet := func() bool {
		mustGet(t, c.db, &openA, `SELECT COUNT(*) FROM `+c.storeA.Table()+` WHERE status <> 1`)
		mustGet(t, c.db, &openB, `SELECT COUNT(*) FROM `+c.storeB.Table()+` WHERE status <> 1`)
		cons, err := c.js.Consumer(ctx, c.stream, durable)
		if err == nil {
			info, err = cons.Info(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		return isClosed(ready) && openA == 0 && openB == 0 && info.NumPending == 0 && info.NumAckPending == 0
	}
	deadline := time.Now().Add(90 * time.Second)
	for !quiet() {
		if time.Now().After(deadline) {
			t.Errorf("the chain is not quiet after 90 s (B ready: %v): %d of A's and %d of B's events not delivered, %d pending and %d unacked in NATS; B's stderr ends: %s",
				isClosed(ready), openA, openB, info.NumPending, info.NumAckPending, c.stderr(c.runs))
			break
		}
		time.Sleep(100 * time.Millisecond) // polling for a state, not waiting for one
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("service B's last run did not close cleanly on SIGTERM: %v: %s", err, c.stderr(c.runs))
	}
}

// checkOnce checks that each of A's events has exactly one effect in B's
// database and one at the receiver, and one event in B's outbox, and
// that no run of B saw a data race.
func (c *chain) checkOnce() {
	t := c.t
	for _, where := range []struct{ what, table string }{{"B's database", c.effectsB}, {"the final receiver", c.effectsC}} {
		var rows []struct {
			AID string `db:"a_id"`
			N   int    `db:"n"`
		}
		if err := c.db.Select(&rows, `SELECT a_id, COUNT(*) AS n FROM `+where.table+` GROUP BY a_id`); err != nil {
			t.Fatal(err)
		}
		got := make(map[string]int, len(rows))
		for _, r := range rows {
			got[r.AID] = r.N
		}
		lost, twice := 0, 0
		for _, id := range c.idsA {
			switch n := got[id]; {
			case n == 0:
				lost++
			case n > 1:
				twice++
				t.Errorf("%s: A's event %s applied %d times", where.what, id, n)
			}
			delete(got, id)
		}
		if lost > 0 || twice > 0 || len(got) > 0 {
			t.Errorf("%s: %d of %d events lost, %d applied more than once, %d effects of unknown ids", where.what, lost, events, twice, len(got))
		}
	}
	var eventsB, deadB int
	mustGet(t, c.db, &eventsB, `SELECT COUNT(*) FROM `+c.storeB.Table())
	mustGet(t, c.db, &deadB, `SELECT COUNT(*) FROM `+c.storeB.Table()+` WHERE status = 3`)
	if eventsB != events || deadB != 0 {
		t.Errorf("B's outbox holds %d events (%d dead), want %d (0 dead): one per applied message", eventsB, deadB, events)
	}
	for run := 1; run <= c.runs; run++ {
		if errs := readLog(t, c.logs, run, "err"); strings.Contains(errs, "DATA RACE") {
			t.Errorf("run %d of service B: the race detector reported: %s", run, errs)
		}
	}
}

// figures logs how much redelivery the kills caused. A transaction cut
// by a kill is a "begin" without its "result applied" or "result failed"
// in its run's output.
func (c *chain) figures(name string) {
	dupB, cut, cutting := 0, 0, 0
	for run := 1; run <= c.runs; run++ {
		out := readLog(c.t, c.logs, run, "out")
		dupB += strings.Count(out, "result duplicate ")
		n := strings.Count(out, "begin ") - strings.Count(out, "result applied ") - strings.Count(out, "result failed ")
		cut += n
		if n > 0 {
			cutting++
		}
	}
	requests, ids := c.final.counts()
	c.t.Logf("%s: %d SIGKILLs of service B (%d inside a transaction), %d events of A; B's transactions cut by a kill: %d; redelivered to B after its commit (duplicates): %d; webhook requests at the receiver: %d for %d ids",
		name, kills, cutting, events, cut, dupB, requests, ids)
}

// stderr returns the end of run's stderr.
func (c *chain) stderr(run int) string { return lastLines(readLog(c.t, c.logs, run, "err"), 20) }

// outWriter writes B's stdout to w, closing ready at its line "ready"
// and working at its first line "begin …" (its first handler call).
type outWriter struct {
	w              io.Writer
	partial        []byte // a line not yet ended
	ready, working chan struct{}
}

func (o *outWriter) Write(p []byte) (int, error) {
	o.partial = append(o.partial, p...)
	for {
		i := bytes.IndexByte(o.partial, '\n')
		if i < 0 {
			break
		}
		line := string(o.partial[:i])
		o.partial = o.partial[i+1:]
		switch {
		case line == "ready" && !isClosed(o.ready):
			close(o.ready)
		case strings.HasPrefix(line, "begin ") && !isClosed(o.working):
			close(o.working)
		}
	}
	return o.w.Write(p)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func mustGet(t *testing.T, db *sqlx.DB, dest any, q string) {
	t.Helper()
	if err := db.Get(dest, q); err != nil {
		t.Fatal(err)
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// readLog returns the stdout ("out") or stderr ("err") of run of B.
func readLog(t *testing.T, dir string, run int, which string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, fmt.Sprintf("run%02d.%s", run, which)))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var b strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String()
}
