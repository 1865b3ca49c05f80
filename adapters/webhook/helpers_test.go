package webhook_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// post is one request the receiver got.
type post struct {
	ID        string // webhook-id
	Header    http.Header
	Body      []byte
	At        time.Time
	VerifyErr error
}

// receiver is a webhook endpoint: it verifies every request with
// webhook.Verify, records it, de-duplicates on webhook-id (as the README
// tells receivers to) and answers with answer's status (204 by default).
type receiver struct {
	srv     *httptest.Server
	secrets []string

	mu     sync.Mutex
	posts  []post
	stored map[string][]byte // the de-duplicated store: webhook-id → body
	answer func(p post, n int) (int, http.Header)
	notify chan struct{}
}

// newReceiver starts a receiver accepting any of secrets; it stops when
// the test ends.
func newReceiver(t testing.TB, secrets ...string) *receiver {
	t.Helper()
	r := &receiver{secrets: secrets, stored: map[string][]byte{}, notify: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("/hook", r.serve)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) URL() string { return r.srv.URL + "/hook" }

// respond sets the answer: f gets the request and how many times its
// webhook-id has been posted, this one included.
func (r *receiver) respond(f func(p post, n int) (int, http.Header)) {
	r.mu.Lock()
	r.answer = f
	r.mu.Unlock()
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	p := post{ID: req.Header.Get(webhook.HeaderID), Header: req.Header.Clone(), Body: body, At: time.Now()}
	p.VerifyErr = webhook.ErrSignature
	for _, s := range r.secrets {
		if p.VerifyErr = webhook.Verify(s, req.Header, body, 0); p.VerifyErr == nil {
			break
		}
	}
	r.mu.Lock()
	r.posts = append(r.posts, p)
	n := 0
	for _, q := range r.posts {
		if q.ID == p.ID {
			n++
		}
	}
	code, hdr := http.StatusNoContent, http.Header(nil)
	if p.VerifyErr != nil {
		code = http.StatusUnauthorized
	} else if r.answer != nil {
		code, hdr = r.answer(p, n)
	}
	if code/100 == 2 {
		if _, dup := r.stored[p.ID]; !dup {
			r.stored[p.ID] = body
		}
	}
	r.mu.Unlock()
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(code)
	io.WriteString(w, "RESPONSE-BODY-NEVER-IN-ERRORS")
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// Posts returns a copy of the requests received so far.
func (r *receiver) Posts() []post {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]post(nil), r.posts...)
}

// PostsOf returns the requests with webhook-id id.
func (r *receiver) PostsOf(id string) []post {
	var out []post
	for _, p := range r.Posts() {
		if p.ID == id {
			out = append(out, p)
		}
	}
	return out
}

// Stored returns the number of distinct events stored.
func (r *receiver) Stored() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.stored)
}

// waitStored waits until n distinct events are stored.
func (r *receiver) waitStored(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for r.Stored() < n {
		select {
		case <-r.notify:
		case <-deadline.C:
			t.Fatalf("receiver stored %d events, want %d within %s", r.Stored(), n, timeout)
		}
	}
}

// fixture is an outbox on a fresh SQLite table with one subscription.
type fixture struct {
	t     testing.TB
	db    *sqlx.DB
	store *sqlstore.Store
	ob    *outbox.Outbox
	sub   string
}

// testConfig is quick: short polls and back-off, so that retries and
// deferred deliveries come back within the tests' deadlines.
func testConfig() outbox.Config {
	return outbox.Config{
		PollInterval:    50 * time.Millisecond,
		PollMaxInterval: 100 * time.Millisecond,
		Retry:           outbox.ExponentialBackoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		ListenerTimeout: 5 * time.Second,
	}
}

// start subscribes sub to a new outbox and starts it; it is closed when
// the test ends.
func start(t testing.TB, sub outbox.Subscription) *fixture {
	t.Helper()
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	ob, err := outbox.New(store, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Subscribe(sub); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ob.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return &fixture{t: t, db: db, store: store, ob: ob, sub: sub.Name}
}

// publish writes envs in one committed transaction and returns their ids.
func (f *fixture) publish(envs ...outbox.Envelope) []string {
	f.t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, f.db.DB, nil)
	if err != nil {
		f.t.Fatal(err)
	}
	ids, err := f.ob.PublishAllTx(ctx, tx, envs...)
	if err != nil {
		tx.Rollback()
		f.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		f.t.Fatal(err)
	}
	return ids
}

// delivery is the subscription's state of one event.
type delivery struct {
	Status    outbox.Status
	Attempts  int
	LastError string
}

func (f *fixture) state(id string) delivery {
	f.t.Helper()
	rec, err := f.store.Inspect(context.Background(), id)
	if err != nil {
		f.t.Fatalf("inspect %s: %v", id, err)
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == f.sub {
			return delivery{d.Status, d.Attempts, d.LastError}
		}
	}
	return delivery{rec.Status, rec.Attempts, rec.LastError}
}

// settle waits until the event is DONE or DEAD for the subscription.
func (f *fixture) settle(id string, timeout time.Duration) delivery {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d := f.state(id)
		if d.Status == outbox.StatusDone || d.Status == outbox.StatusDead {
			return d
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("event %s not settled within %s: %+v", id, timeout, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newPublisher returns a Publisher for cfg, closed when the test ends.
func newPublisher(t testing.TB, cfg webhook.Config) *webhook.Publisher {
	t.Helper()
	p, err := webhook.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// uniqueName returns a subscription name unique to this run.
func uniqueName(prefix string) string { return prefix + "-" + outbox.NewID()[14:] }
