package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
)

var testSecret = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes

// renv is a database with the inbox tables and a business table, and a
// Receiver on an httptest server.
type renv struct {
	db    *sqlx.DB
	ib    *inbox.Inbox
	items string
	calls atomic.Int64
	srv   *httptest.Server
	rc    *webhook.Receiver

	mu  sync.Mutex
	obs []inbox.Observation
	got chan inbox.Observation
}

func newRenv(t *testing.T, dbName string, icfg inbox.Config, rcfg webhook.ReceiverConfig) *renv {
	t.Helper()
	e := &renv{db: testdb.Open(t, dbName), got: make(chan inbox.Observation, 100)}
	store := testdb.Store(t, e.db)
	e.items = testdb.TableName("items")
	if _, err := e.db.Exec("CREATE TABLE " + e.items + " (id VARCHAR(255) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testdb.DropTable(t, e.db, e.items) })
	icfg.Dialect, _ = inbox.DialectNamed(store.Dialect().Name())
	icfg.Table = strings.Trim(store.Table(), "`\"")
	icfg.Observe = func(o inbox.Observation) { e.got <- o }
	var err error
	if e.ib, err = inbox.New(e.db.DB, icfg); err != nil {
		t.Fatal(err)
	}
	rcfg.Inbox, rcfg.Name, rcfg.Secrets = e.ib, "hooks", []string{testSecret}
	if rcfg.Handler == nil {
		rcfg.Handler = e.apply
	}
	if e.rc, err = webhook.NewReceiver(rcfg); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.rc)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *renv) apply(ctx context.Context, m inbox.Message) error {
	e.calls.Add(1)
	_, err := inbox.Tx(ctx).ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
	return err
}

func (e *renv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.Get(&n, "SELECT COUNT(*) FROM "+e.items); err != nil {
		t.Fatal(err)
	}
	return n
}

// request builds a signed POST of body with webhook-id id.
func request(t *testing.T, url, id string, body []byte, secret string, at time.Time) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sig, err := webhook.Sign(secret, id, at, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(webhook.HeaderID, id)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	req.Header.Set(webhook.HeaderSignature, sig)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func (e *renv) send(t *testing.T, id string, body string) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(request(t, e.srv.URL, id, []byte(body), testSecret, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func eachRecvDB(t *testing.T, fn func(t *testing.T, db string)) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name)
		})
	}
}

// A request sent again (the sender's retry) is applied once and answered
// 200, or DuplicateStatus.
func TestReceiverAppliesOnceAcrossRetries(t *testing.T) {
	eachRecvDB(t, func(t *testing.T, db string) {
		e := newRenv(t, db, inbox.Config{}, webhook.ReceiverConfig{})
		for i, want := range []int{200, 200, 200} {
			if got := e.send(t, "evt-1", `{"n":1}`); got != want {
				t.Errorf("send %d: %d, want %d", i, got, want)
			}
		}
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 {
			t.Errorf("rows %d, handler calls %d; want 1, 1", n, calls)
		}
		e409 := newRenv(t, db, inbox.Config{}, webhook.ReceiverConfig{DuplicateStatus: http.StatusConflict})
		if a, b := e409.send(t, "evt-1", `{}`), e409.send(t, "evt-1", `{}`); a != 200 || b != 409 {
			t.Errorf("with DuplicateStatus 409: %d, %d; want 200, 409", a, b)
		}
	})
}

// The end-to-end case of a crash between commit and ack: our sender
// (outbox + Publisher) posts an event, the receiver commits it, and the
// response is lost (the connection is cut after the commit). The sender
// retries, the receiver answers the duplicate 200, and the effect is
// there once.
func TestReceiverResponseLostAfterCommit(t *testing.T) {
	eachRecvDB(t, func(t *testing.T, db string) {
		e := newRenv(t, db, inbox.Config{}, webhook.ReceiverConfig{})
		var posts atomic.Int64
		cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if posts.Add(1) == 1 {
				e.rc.ServeHTTP(httptest.NewRecorder(), r) // commits
				panic(http.ErrAbortHandler)               // and the answer never leaves
			}
			e.rc.ServeHTTP(w, r)
		}))
		t.Cleanup(cut.Close)
		pub, err := webhook.New(webhook.Config{URL: cut.URL, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		f := start(t, outbox.Subscription{Name: "to-hook", Handler: pub.Handler()})
		ids := f.publish(outbox.Envelope{Type: "order.placed", JSON: []byte(`{"id":1}`)})
		for _, want := range []inbox.Result{inbox.Applied, inbox.Duplicate} {
			select {
			case o := <-e.got:
				if o.Result != want || o.MessageID != ids[0] {
					t.Fatalf("receiver: %v of %s, want %v of %s", o.Result, o.MessageID, want, ids[0])
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("receiver: no %v within 30 s", want)
			}
		}
		if n, calls := e.rows(t), e.calls.Load(); n != 1 || calls != 1 || posts.Load() != 2 {
			t.Errorf("rows %d, handler calls %d, posts %d; want 1, 1, 2", n, calls, posts.Load())
		}
	})
}

// A failing handler answers 500 (the sender retries), and the message is
// applied once when it recovers.
func TestReceiverFailingHandlerAppliesOnceAfterRecovery(t *testing.T) {
	eachRecvDB(t, func(t *testing.T, db string) {
		var fails atomic.Int64
		var e *renv
		e = newRenv(t, db, inbox.Config{MaxAttempts: 5}, webhook.ReceiverConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			if fails.Add(1) <= 2 {
				return errors.New("downstream is down")
			}
			return nil
		}})
		got := []int{e.send(t, "r-1", `{}`), e.send(t, "r-1", `{}`), e.send(t, "r-1", `{}`), e.send(t, "r-1", `{}`)}
		if got[0] != 500 || got[1] != 500 || got[2] != 200 || got[3] != 200 {
			t.Errorf("answers %v, want 500 500 200 200", got)
		}
		if n := e.rows(t); n != 1 {
			t.Errorf("rows %d, want 1", n)
		}
	})
}

// A poison request is parked after MaxAttempts and answered 200, so that
// the sender stops; the next request is applied.
func TestReceiverPoisonParked(t *testing.T) {
	eachRecvDB(t, func(t *testing.T, db string) {
		var e *renv
		e = newRenv(t, db, inbox.Config{MaxAttempts: 2}, webhook.ReceiverConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			if m.ID == "poison" {
				panic("decoder bug")
			}
			return e.apply(ctx, m)
		}})
		if a, b, c := e.send(t, "poison", `{"x":1}`), e.send(t, "poison", `{"x":1}`), e.send(t, "poison", `{"x":1}`); a != 500 || b != 200 || c != 200 {
			t.Errorf("poison answers %d %d %d, want 500 200 200", a, b, c)
		}
		if got := e.send(t, "next", `{}`); got != 200 || e.rows(t) != 1 {
			t.Errorf("next request: %d, rows %d", got, e.rows(t))
		}
		parked, err := e.ib.Parked(context.Background(), inbox.ParkedFilter{Consumer: "hooks"})
		if err != nil || len(parked) != 1 || string(parked[0].Message.Payload) != `{"x":1}` ||
			parked[0].Message.Headers["content-type"] != "application/json" || parked[0].Message.Headers[webhook.HeaderSignature] != "" ||
			!strings.Contains(parked[0].LastError, "decoder bug") {
			t.Errorf("parked %+v %v", parked, err)
		}
	})
}

// Requests that are not authentic or not acceptable are refused before
// the inbox: nothing is handled or stored.
func TestReceiverRefusesBadRequests(t *testing.T) {
	e := newRenv(t, "sqlite", inbox.Config{}, webhook.ReceiverConfig{MaxBodyBytes: 64})
	other := "whsec_" + "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
	get, _ := http.NewRequest(http.MethodGet, e.srv.URL, nil)
	unsigned, _ := http.NewRequest(http.MethodPost, e.srv.URL, strings.NewReader("{}"))
	tampered := request(t, e.srv.URL, "x", []byte(`{"amount":1}`), testSecret, time.Now())
	tampered.Body, tampered.ContentLength = http.NoBody, 0
	cases := []struct {
		name string
		req  *http.Request
		want int
	}{
		{"GET", get, 405},
		{"no headers", unsigned, 400},
		{"other secret", request(t, e.srv.URL, "x", []byte("{}"), other, time.Now()), 401},
		{"tampered body", tampered, 401},
		{"old timestamp", request(t, e.srv.URL, "x", []byte("{}"), testSecret, time.Now().Add(-time.Hour)), 401},
		{"too large", request(t, e.srv.URL, "x", bytes.Repeat([]byte("a"), 65), testSecret, time.Now()), 413},
		{"id too long", request(t, e.srv.URL, strings.Repeat("i", 300), []byte("{}"), testSecret, time.Now()), 400},
	}
	for _, c := range cases {
		resp, err := http.DefaultClient.Do(c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", c.name, resp.StatusCode, c.want)
		}
	}
	if e.calls.Load() != 0 || e.rows(t) != 0 {
		t.Errorf("bad requests handled: %d calls", e.calls.Load())
	}
	if _, err := webhook.NewReceiver(webhook.ReceiverConfig{Inbox: e.ib, Name: "x", Handler: e.apply}); err == nil || !strings.Contains(err.Error(), "Secrets is empty") {
		t.Errorf("NewReceiver without secrets: %v", err)
	}
}

// http.Server.Shutdown lets a request being handled finish: it commits
// and is answered 200; nothing is lost.
func TestReceiverShutdownFinishesInFlight(t *testing.T) {
	eachRecvDB(t, func(t *testing.T, db string) {
		entered, release := make(chan struct{}), make(chan struct{})
		var e *renv
		e = newRenv(t, db, inbox.Config{}, webhook.ReceiverConfig{Handler: func(ctx context.Context, m inbox.Message) error {
			close(entered)
			<-release
			return e.apply(ctx, m)
		}})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: e.rc}
		go srv.Serve(ln)
		answered := make(chan int, 1)
		go func() {
			resp, err := http.DefaultClient.Do(request(t, "http://"+ln.Addr().String(), "s-1", []byte("{}"), testSecret, time.Now()))
			if err != nil {
				answered <- -1
				return
			}
			resp.Body.Close()
			answered <- resp.StatusCode
		}()
		<-entered
		shut := make(chan error, 1)
		go func() { shut <- srv.Shutdown(context.Background()) }()
		close(release)
		if code := <-answered; code != 200 {
			t.Errorf("in-flight request answered %d, want 200", code)
		}
		if err := <-shut; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if n := e.rows(t); n != 1 {
			t.Errorf("rows %d, want 1", n)
		}
	})
}
