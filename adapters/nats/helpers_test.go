package natsoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// connect opens a NATS connection to url that reconnects fast and for
// ever; it is closed when t ends.
func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectJitter(0, 0),
		nats.Timeout(time.Second),
	)
	if err != nil {
		t.Fatalf("nats.Connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// testStream is a stream of its own for one test: it takes the subjects
// under prefix and is deleted when the test ends.
type testStream struct {
	name, prefix string
	s            jetstream.Stream
}

func newStream(t testing.TB, js jetstream.JetStream, mod func(*jetstream.StreamConfig)) *testStream {
	t.Helper()
	id := outbox.NewID()
	ts := &testStream{name: "TXO_" + id, prefix: "txo" + strings.ToLower(id)}
	cfg := jetstream.StreamConfig{
		Name:       ts.name,
		Subjects:   []string{ts.prefix + ".>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: 10 * time.Minute,
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatalf("create stream: %v", err)
	}
	ts.s = s
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, ts.name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", ts.name, err)
		}
	})
	return ts
}

// count is the number of messages in the stream.
func (ts *testStream) count(t testing.TB) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := ts.s.Info(ctx)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	return info.State.Msgs
}

// waitCount polls until the stream holds n messages.
func (ts *testStream) waitCount(t testing.TB, n uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := ts.count(t)
		if got == n {
			return
		}
		if got > n || time.Now().After(deadline) {
			t.Fatalf("stream %s holds %d messages, want %d", ts.name, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// msgs returns every message in the stream, in order.
func (ts *testStream) msgs(t testing.TB) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := ts.count(t)
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); seq <= n; seq++ {
		m, err := ts.s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// env is an outbox on SQLite with fast polling, for one test.
type env struct {
	db    *sqlx.DB
	store *sqlstore.Store
	ob    *outbox.Outbox
}

func newOutbox(t testing.TB, cfg outbox.Config) *env {
	t.Helper()
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
		cfg.PollMaxInterval = 200 * time.Millisecond
	}
	if cfg.SkipRecent == 0 {
		cfg.SkipRecent = -1
	}
	ob, err := outbox.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{db: db, store: store, ob: ob}
}

// start starts the outbox; it is closed when the test ends, before the
// NATS connections (cleanups run last-in first-out).
func (e *env) start(t testing.TB) {
	t.Helper()
	if err := e.ob.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.ob.Close(ctx); err != nil {
			t.Errorf("close outbox: %v", err)
		}
	})
}

// publish publishes envs in one transaction and commits it (or rolls it
// back), returning the event ids.
func (e *env) publish(t testing.TB, commit bool, envs ...outbox.Envelope) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, e.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := e.ob.PublishAllTx(ctx, tx, envs...)
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// delivery is the state of the subscription's delivery of event id.
type delivery struct {
	Status    outbox.Status
	Attempts  int
	LastError string
}

func (e *env) delivery(t testing.TB, id, sub string) delivery {
	t.Helper()
	rec, err := e.store.Inspect(context.Background(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	for _, d := range rec.Deliveries {
		if d.Subscription == sub {
			return delivery{d.Status, d.Attempts, d.LastError}
		}
	}
	return delivery{rec.Status, rec.Attempts, rec.LastError}
}

// waitDelivery polls until the delivery of id is in a final state (DONE
// or DEAD) and returns it.
func (e *env) waitDelivery(t testing.TB, id, sub string, within time.Duration) delivery {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		d := e.delivery(t, id, sub)
		if d.Status == outbox.StatusDone || d.Status == outbox.StatusDead {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s: delivery still %+v after %v", id, d, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func jsonPayload(i int) []byte { return fmt.Appendf(nil, `{"n":%d}`, i) }
