package redisoutbox_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	redisoutbox "github.com/txoutbox/txoutbox/adapters/redis"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

const (
	traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tracestate  = "vendor=abc"
)

// A committed event is one stream entry: the metadata fields in the order
// of outbox/meta (txoutbox-id first), the user and trace
// headers, then the payload byte for byte, for JSON and for bytes.
func TestCommitAddsOneEntry(t *testing.T) {
	f := setup(t, setupOpts{})
	at := time.Date(2026, 3, 4, 5, 6, 7, 890123000, time.UTC) // SQLite keeps microseconds
	binary := []byte{0, 0xff, 0xfe, '\n', 'x', 0x80}
	ids := f.publish(
		outbox.Envelope{
			Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", TenantID: "t1", OccurredAt: at,
			Headers: map[string]string{"x-user": "ana", "traceparent": traceparent, "tracestate": tracestate},
			JSON:    []byte(`{"item":"book", "n": 1}`),
		},
		outbox.Envelope{Type: "Blob", OccurredAt: at, Bytes: binary, Headers: map[string]string{"content-type": "application/x-blob"}},
	)
	es := f.waitLen(f.stream, 2, 5*time.Second)
	got := f.settled(ids, 5*time.Second)
	for _, id := range ids {
		if o := got[id]; o.status != outbox.StatusDone || o.attempts != 0 {
			t.Fatalf("event %s: %+v, want done at the first attempt", id, o)
		}
	}
	es = f.entries(f.stream)
	if len(es) != 2 {
		t.Fatalf("stream has %d entries, want 2:\n%s", len(es), describe(es))
	}
	if es[0].get("txoutbox-id") != ids[0] { // two calls may deliver them in either order
		es[0], es[1] = es[1], es[0]
	}
	want := [][2]string{
		{"txoutbox-id", ids[0]}, {"txoutbox-type", "OrderPlaced"}, {"txoutbox-aggregate-type", "order"},
		{"txoutbox-aggregate-id", "42"}, {"txoutbox-tenant-id", "t1"},
		{"txoutbox-occurred-at", "2026-03-04T05:06:07.890123Z"}, {"content-type", "application/json"},
		{"traceparent", traceparent}, {"tracestate", tracestate}, {"x-user", "ana"},
		{"payload", `{"item":"book", "n": 1}`},
	}
	if !reflect.DeepEqual(es[0].Fields, want) {
		t.Errorf("entry 1:\n got %v\nwant %v", es[0].Fields, want)
	}
	want = [][2]string{
		{"txoutbox-id", ids[1]}, {"txoutbox-type", "Blob"},
		{"txoutbox-occurred-at", "2026-03-04T05:06:07.890123Z"}, {"content-type", "application/x-blob"},
		{"payload", string(binary)},
	}
	if !reflect.DeepEqual(es[1].Fields, want) {
		t.Errorf("entry 2:\n got %q\nwant %q", es[1].Fields, want)
	}
	if !bytes.Equal([]byte(es[1].get("payload")), binary) {
		t.Errorf("payload bytes %x, want %x", es[1].get("payload"), binary)
	}
}

// A rolled-back transaction adds nothing: after it, a committed event is
// the only entry of the stream.
func TestRollbackAddsNothing(t *testing.T) {
	f := setup(t, setupOpts{})
	tx, err := outbox.BeginTx(f.ctx, f.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ob.PublishTx(f.ctx, tx, outbox.Envelope{Type: "RolledBack", JSON: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	ids := f.publish(outbox.Envelope{Type: "Committed", JSON: []byte(`2`)})
	f.waitLen(f.stream, 1, 5*time.Second)
	f.settled(ids, 5*time.Second)
	if es := f.entries(f.stream); len(es) != 1 || es[0].get("txoutbox-id") != ids[0] {
		t.Fatalf("stream:\n%s\nwant only %s", describe(es), ids[0])
	}
}

// Redis Streams do not de-duplicate: the same event delivered twice (the
// process died before the outbox recorded it as done) is two entries with
// the same txoutbox-id, on which consumers de-duplicate. With Idempotent,
// it is one entry.
func TestRedelivery(t *testing.T) {
	ev := outbox.Event{Envelope: outbox.Envelope{ID: "01JREDELIVERED", Type: "OrderPlaced", OccurredAt: time.Now(), JSON: []byte(`{"a":1}`)}}
	for _, idem := range []bool{false, true} {
		name := "default"
		if idem {
			name = "idempotent"
		}
		t.Run(name, func(t *testing.T) {
			addr := testbroker.Redis(t)
			rdb := newClient(t, addr)
			stream := prefix(t, rdb) + "events"
			cfg := redisoutbox.Config{Stream: stream}
			if idem {
				cfg.IdempotentTTL = time.Minute
			}
			pub, err := redisoutbox.New(rdb, cfg)
			if err != nil {
				t.Fatal(err)
			}
			h := pub.Handler()
			for range 2 {
				if err := h(context.Background(), []outbox.Event{ev}); err != nil {
					t.Fatalf("delivery: %v", err)
				}
			}
			f := &fixture{t: t, ctx: context.Background(), rdb: rdb}
			es := f.entries(stream)
			want := 2
			if idem {
				want = 1
				if ttl := rdb.PTTL(f.ctx, pub.DedupKey(stream, ev.ID)).Val(); ttl <= 0 || ttl > time.Minute {
					t.Errorf("marker ttl %v", ttl)
				}
			}
			if len(es) != want {
				t.Fatalf("%d entries, want %d:\n%s", len(es), want, describe(es))
			}
			for _, e := range es {
				if e.get("txoutbox-id") != ev.ID {
					t.Fatalf("entry without the event id:\n%s", describe(es))
				}
			}
		})
	}
}

// Idempotent mode through the engine: the handler stores the event, then
// the call fails as if the process died before the done mark; the outbox
// delivers it again, and the stream still has one entry.
func TestIdempotentThroughEngine(t *testing.T) {
	var once sync.Once
	var mu sync.Mutex
	calls := 0
	f := setup(t, setupOpts{
		cfg: redisoutbox.Config{IdempotentTTL: time.Minute},
		wrap: func(h outbox.BatchHandler) outbox.BatchHandler {
			return func(ctx context.Context, evs []outbox.Event) error {
				mu.Lock()
				calls++
				mu.Unlock()
				err := h(ctx, evs)
				if err == nil {
					once.Do(func() { err = errors.New("crash before the done mark") })
				}
				return err
			}
		},
	})
	ids := f.publish(outbox.Envelope{Type: "OrderPlaced", JSON: []byte(`{}`)})
	o := f.settled(ids, 5*time.Second)[ids[0]]
	mu.Lock()
	n := calls
	mu.Unlock()
	if o.status != outbox.StatusDone || n != 2 {
		t.Fatalf("outcome %+v after %d calls, want done at the second", o, n)
	}
	if es := f.entries(f.stream); len(es) != 1 || es[0].get("txoutbox-id") != ids[0] {
		t.Fatalf("stream:\n%s\nwant one entry of %s", describe(es), ids[0])
	}
}

// An event bigger than MaxMessageBytes is dead at its first attempt, with
// the sizes in its last error, and adds nothing; the next event goes.
func TestOversizedIsDeadAtOnce(t *testing.T) {
	f := setup(t, setupOpts{cfg: redisoutbox.Config{MaxMessageBytes: 4096}, sub: outbox.Subscription{MaxAttempts: 5}})
	ids := f.publish(
		outbox.Envelope{Type: "Big", Bytes: bytes.Repeat([]byte("x"), 5000)},
		outbox.Envelope{Type: "Small", Bytes: []byte("x")},
	)
	got := f.settled(ids, 5*time.Second)
	big := got[ids[0]]
	if big.status != outbox.StatusDead || big.attempts != 1 {
		t.Fatalf("big event: %+v, want dead at the first attempt", big)
	}
	if !strings.Contains(big.lastError, "over MaxMessageBytes 4096") || !strings.Contains(big.lastError, "payload 5000 bytes") {
		t.Errorf("last error %q does not say why", big.lastError)
	}
	if o := got[ids[1]]; o.status != outbox.StatusDone {
		t.Fatalf("small event: %+v", o)
	}
	if es := f.entries(f.stream); len(es) != 1 || es[0].get("txoutbox-id") != ids[1] {
		t.Fatalf("stream:\n%s", describe(es))
	}
}

// One batch, one pipeline, an outcome per event: among good events, one
// too big (dead at once), one without the tenant its stream template needs
// (dead at once) and one whose stream key holds a string (WRONGTYPE: an
// ordinary failure, retried) fail alone; the others are stored, in order.
func TestBatchOutcomePerEvent(t *testing.T) {
	addr := testbroker.Redis(t)
	rdb := newClient(t, addr)
	p := prefix(t, rdb)
	pub, err := redisoutbox.New(rdb, redisoutbox.Config{StreamTemplate: p + "${tenant}", MaxMessageBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := rdb.Set(ctx, p+"notastream", "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	var evs []outbox.Event
	for i := range 10 {
		evs = append(evs, outbox.Event{Envelope: outbox.Envelope{ID: string(rune('a' + i)), Type: "T", TenantID: "good", JSON: []byte(`1`)}})
	}
	evs[2].Bytes, evs[2].JSON = make([]byte, 2000), nil
	evs[5].TenantID = ""
	evs[7].TenantID = "notastream"
	err = pub.Handler()(ctx, evs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(evs) {
		t.Fatalf("err %v, want a BatchError of %d", err, len(evs))
	}
	for i, e := range be.Errs {
		switch i {
		case 2, 5:
			if e == nil || outbox.DefaultClassifier(e) != outbox.DecisionDead {
				t.Errorf("event %d: %v, want a permanent error", i, e)
			}
		case 7:
			if e == nil || !strings.Contains(e.Error(), "WRONGTYPE") || outbox.DefaultClassifier(e) == outbox.DecisionDead {
				t.Errorf("event %d: %v, want a WRONGTYPE error to retry", i, e)
			}
			if down, _ := outbox.IsUnavailable(e); down {
				t.Errorf("event %d: %v is marked unavailable", i, e)
			}
		default:
			if e != nil {
				t.Errorf("event %d: %v", i, e)
			}
		}
	}
	f := &fixture{t: t, ctx: ctx, rdb: rdb}
	var got []string
	for _, e := range f.entries(p + "good") {
		got = append(got, e.get("txoutbox-id"))
	}
	if want := []string{"a", "b", "d", "e", "g", "i", "j"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
}

// The same through the engine: one Batch call with a bad event among good
// ones, and only the bad one is dead.
func TestBatchThroughEngine(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	f := setup(t, setupOpts{
		cfg: redisoutbox.Config{MaxMessageBytes: 1024},
		sub: outbox.Subscription{BatchSize: 20, BatchLinger: 50 * time.Millisecond},
		wrap: func(h outbox.BatchHandler) outbox.BatchHandler {
			return func(ctx context.Context, evs []outbox.Event) error {
				mu.Lock()
				sizes = append(sizes, len(evs))
				mu.Unlock()
				return h(ctx, evs)
			}
		},
	})
	envs := make([]outbox.Envelope, 10)
	for i := range envs {
		envs[i] = outbox.Envelope{Type: "T", JSON: []byte(`1`)}
	}
	envs[4].JSON, envs[4].Bytes = nil, make([]byte, 2000)
	ids := f.publish(envs...)
	got := f.settled(ids, 5*time.Second)
	for i, id := range ids {
		want := outbox.StatusDone
		if i == 4 {
			want = outbox.StatusDead
		}
		if got[id].status != want {
			t.Errorf("event %d: %+v, want %v", i, got[id], want)
		}
	}
	if es := f.entries(f.stream); len(es) != 9 {
		t.Fatalf("%d entries, want 9", len(es))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) == 0 || sizes[0] < 2 {
		t.Logf("batch sizes %v: the events did not come in one call", sizes)
	}
}

// MaxLen trims the stream to about n entries (MAXLEN ~), in both modes.
func TestMaxLenTrims(t *testing.T) {
	for _, idem := range []bool{false, true} {
		addr := testbroker.Redis(t)
		rdb := newClient(t, addr)
		stream := prefix(t, rdb) + "events"
		cfg := redisoutbox.Config{Stream: stream, MaxLen: 10}
		if idem {
			cfg.IdempotentTTL = time.Minute
		}
		pub, err := redisoutbox.New(rdb, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for i := range 30 {
			var evs []outbox.Event
			for j := range 10 {
				evs = append(evs, outbox.Event{Envelope: outbox.Envelope{ID: string(rune('A'+i)) + string(rune('a'+j)), Type: "T", JSON: []byte(`1`)}})
			}
			if err := pub.Handler()(ctx, evs); err != nil {
				t.Fatal(err)
			}
		}
		// ~ trims whole nodes (100 entries by default): 300 added, at most
		// a node more than 10 left.
		if n := rdb.XLen(ctx, stream).Val(); n < 10 || n > 110 {
			t.Fatalf("idempotent=%v: %d entries left of 300 with MaxLen 10", idem, n)
		}
	}
}

// The script cache may be empty (a restart, SCRIPT FLUSH): the Idempotent
// publisher sends the script again. (SCRIPT FLUSH only empties the shared
// server's script cache, as a restart does; clients that use scripts load
// them again.)
func TestIdempotentAfterScriptFlush(t *testing.T) {
	addr := testbroker.Redis(t)
	rdb := newClient(t, addr)
	stream := prefix(t, rdb) + "events"
	pub, err := redisoutbox.New(rdb, redisoutbox.Config{Stream: stream, IdempotentTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"x", "y", "x"} {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		ev := outbox.Event{Envelope: outbox.Envelope{ID: id, Type: "T", JSON: []byte(`1`)}}
		if err := pub.Handle(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if n := rdb.XLen(ctx, stream).Val(); n != 2 {
		t.Fatalf("%d entries, want 2 (x, y)", n)
	}
}

// Decode gives a Go consumer back the envelope that was published.
func TestDecode(t *testing.T) {
	f := setup(t, setupOpts{})
	at := time.Date(2026, 3, 4, 5, 6, 7, 123000, time.UTC)
	envs := []outbox.Envelope{
		{Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", TenantID: "t1", OccurredAt: at,
			Headers: map[string]string{"x-user": "ana", "traceparent": traceparent}, JSON: []byte(`{"a":1}`)},
		{Type: "Blob", OccurredAt: at, Bytes: []byte{0, 1, 0xff}, Headers: map[string]string{"content-type": "application/x-blob"}},
		{Type: "Raw", OccurredAt: at, Bytes: []byte("r")},
	}
	ids := f.publish(envs...)
	f.waitLen(f.stream, 3, 5*time.Second)
	ms, err := f.rdb.XRange(f.ctx, f.stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != len(envs) {
		t.Fatalf("%d entries", len(ms))
	}
	for _, m := range ms {
		got, err := redisoutbox.Decode(m, "")
		if err != nil {
			t.Fatal(err)
		}
		i := slices.Index(ids, got.ID)
		if i < 0 {
			t.Fatalf("unknown id %s", got.ID)
		}
		want := envs[i]
		want.ID = ids[i]
		if !got.OccurredAt.Equal(want.OccurredAt) {
			t.Errorf("%d: occurred at %v, want %v", i, got.OccurredAt, want.OccurredAt)
		}
		got.OccurredAt = want.OccurredAt
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%d:\n got %+v\nwant %+v", i, got, want)
		}
	}
	if _, err := redisoutbox.Decode(ms[0], "body"); err == nil {
		t.Error("Decode without the payload field: no error")
	}
}
