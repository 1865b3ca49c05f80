package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// callLog is an ordered record of what interceptors and handlers did.
type callLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *callLog) add(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *callLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

type ctxKey string

// namedInterceptor sets the header x-<name> at Publish, and around each
// call logs its entry and exit and puts <name> in the context.
type namedInterceptor struct {
	name string
	log  *callLog
}

func (n *namedInterceptor) Publish(ctx context.Context, env *outbox.Envelope) {
	keys := slices.Sorted(maps.Keys(env.Headers))
	n.log.add("%s publish %s %s", n.name, env.ID, strings.Join(keys, ","))
	env.Headers["x-"+n.name] = n.name
}

func (n *namedInterceptor) Deliver(ctx context.Context, sub string, evs []outbox.Event, next func(context.Context) error) error {
	n.log.add("%s> %s %d", n.name, sub, len(evs))
	err := next(context.WithValue(ctx, ctxKey(n.name), n.name))
	n.log.add("<%s %v", n.name, err)
	return err
}

func quietOutbox(t *testing.T, st *outboxtest.Store, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob, err := outbox.New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

func startAndDrain(t *testing.T, st *outboxtest.Store, ob *outbox.Outbox, publish func(ctx context.Context, tx *outboxtest.Tx)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ob.Close(ctx)
	})
	tx := st.Begin(ctx)
	publish(ctx, tx)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := st.Drain(ctx, ob); err != nil {
		t.Fatal(err)
	}
}

// Interceptors run in order at Publish (each sees the id and the headers
// the ones before it set; the caller's map is left alone; what they set is
// in the stored row and in the handler's event) and nest around the
// handler call, first outermost, the handler getting the context the
// innermost passed on.
func TestInterceptorOrderAndHeaders(t *testing.T) {
	st := outboxtest.NewStore()
	log := &callLog{}
	ob := quietOutbox(t, st, outbox.Config{Interceptors: []outbox.Interceptor{
		&namedInterceptor{"a", log}, &namedInterceptor{"b", log},
	}})
	var got outbox.Event
	if err := ob.Subscribe(outbox.Subscription{Name: "h", Handler: func(ctx context.Context, ev outbox.Event) error {
		log.add("handler a=%v b=%v", ctx.Value(ctxKey("a")), ctx.Value(ctxKey("b")))
		got = ev
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	callers := map[string]string{"x-user": "u1"}
	var id string
	startAndDrain(t, st, ob, func(ctx context.Context, tx *outboxtest.Tx) {
		var err error
		if id, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`), Headers: callers}); err != nil {
			t.Fatal(err)
		}
	})
	want := []string{
		"a publish " + id + " x-user",
		"b publish " + id + " x-a,x-user",
		"a> h 1", "b> h 1", "handler a=a b=b", "<b <nil>", "<a <nil>",
	}
	if l := log.get(); !slices.Equal(l, want) {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(l, "\n"), strings.Join(want, "\n"))
	}
	if len(callers) != 1 {
		t.Errorf("the caller's headers were modified: %v", callers)
	}
	wantHeaders := map[string]string{"x-user": "u1", "x-a": "a", "x-b": "b"}
	rec, err := ob.Inspect(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var stored map[string]string
	if err := json.Unmarshal(rec.Headers, &stored); err != nil || !maps.Equal(stored, wantHeaders) {
		t.Errorf("stored headers %s (%v), want %v", rec.Headers, err, wantHeaders)
	}
	if !maps.Equal(got.Headers, wantHeaders) || got.ID != id {
		t.Errorf("handler got event %s with headers %v, want %s with %v", got.ID, got.Headers, id, wantHeaders)
	}
}

// PublishAll runs the interceptors once per envelope, each with its own
// headers map, even when the caller passes one map to all of them and
// when the envelope had none.
func TestInterceptorPublishAll(t *testing.T) {
	st := outboxtest.NewStore()
	log := &callLog{}
	ob := quietOutbox(t, st, outbox.Config{Interceptors: []outbox.Interceptor{&namedInterceptor{"a", log}}})
	shared := map[string]string{"k": "v"}
	var ids []string
	startAndDrain(t, st, ob, func(ctx context.Context, tx *outboxtest.Tx) {
		var err error
		ids, err = ob.PublishAllTx(ctx, tx,
			outbox.Envelope{Type: "T", JSON: []byte(`1`), Headers: shared},
			outbox.Envelope{Type: "T", JSON: []byte(`2`), Headers: shared},
			outbox.Envelope{Type: "T", JSON: []byte(`3`)})
		if err != nil {
			t.Fatal(err)
		}
	})
	want := []string{"a publish " + ids[0] + " k", "a publish " + ids[1] + " k", "a publish " + ids[2] + " "}
	if l := log.get(); !slices.Equal(l, want) {
		t.Errorf("calls %q, want %q", l, want)
	}
	if len(shared) != 1 {
		t.Errorf("the caller's shared headers were modified: %v", shared)
	}
	for _, id := range ids {
		rec, err := ob.Inspect(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(rec.Headers), `"x-a":"a"`) {
			t.Errorf("event %s stored headers %s, want x-a", id, rec.Headers)
		}
	}
}

// deliveryRecorder records each Deliver call: the subscription, the ids
// and attempts of its events, and next's error.
type deliveryRecorder struct {
	log *callLog
}

func (deliveryRecorder) Publish(context.Context, *outbox.Envelope) {}

func (d deliveryRecorder) Deliver(ctx context.Context, sub string, evs []outbox.Event, next func(context.Context) error) error {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = fmt.Sprintf("%s#%d", ev.JSON, ev.Attempt)
	}
	err := next(ctx)
	d.log.add("%s [%s] err=%v", sub, strings.Join(ids, " "), err != nil)
	return err
}

// Deliver wraps every handler call: a Batch subscription's calls with all
// the events of each call, and each attempt of a failing Handler.
func TestInterceptorWrapsBatchesAndRetries(t *testing.T) {
	st := outboxtest.NewStore()
	log := &callLog{}
	ob := quietOutbox(t, st, outbox.Config{
		Interceptors: []outbox.Interceptor{deliveryRecorder{log}},
		Retry:        outbox.RetryFunc(func(int) time.Duration { return 0 }), // due at once, for Drain
	})
	batches := &callLog{}
	if err := ob.Subscribe(outbox.Subscription{Name: "batch", BatchSize: 3, BatchLinger: 5 * time.Millisecond, Batch: func(ctx context.Context, evs []outbox.Event) error {
		ids := make([]string, len(evs))
		for i, ev := range evs {
			ids[i] = fmt.Sprintf("%s#%d", ev.JSON, ev.Attempt)
		}
		batches.add("batch [%s] err=false", strings.Join(ids, " "))
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	h := outboxtest.Failing(func(context.Context, outbox.Event) error { return nil })
	h.FailNext(1, nil)
	if err := ob.Subscribe(outbox.Subscription{Name: "flaky", Types: []outbox.EventType{"F"}, Handler: h.Handle}); err != nil {
		t.Fatal(err)
	}
	startAndDrain(t, st, ob, func(ctx context.Context, tx *outboxtest.Tx) {
		envs := []outbox.Envelope{{Type: "F", JSON: []byte(`0`)}}
		for i := 1; i <= 5; i++ {
			envs = append(envs, outbox.Envelope{Type: "B", JSON: fmt.Appendf(nil, "%d", i)})
		}
		if _, err := ob.PublishAllTx(ctx, tx, envs...); err != nil {
			t.Fatal(err)
		}
	})
	var wrappedBatches, flaky []string
	n := 0
	for _, l := range log.get() {
		switch {
		case strings.HasPrefix(l, "batch "):
			wrappedBatches = append(wrappedBatches, l)
			n += strings.Count(l, "#")
		case strings.HasPrefix(l, "flaky "):
			flaky = append(flaky, l)
		default:
			t.Errorf("unexpected call %q", l)
		}
	}
	slices.Sort(wrappedBatches)
	calls := batches.get()
	slices.Sort(calls)
	if !slices.Equal(wrappedBatches, calls) {
		t.Errorf("wrapped batch calls %q, handler's calls %q: want the same", wrappedBatches, calls)
	}
	if n != 6 || len(calls) < 2 { // event 0 goes to the batch subscription too (it takes every type)
		t.Errorf("batch calls %q carry %d events; want 6 in at least 2 calls of at most 3", calls, n)
	}
	if want := []string{"flaky [0#1] err=true", "flaky [0#2] err=false"}; !slices.Equal(flaky, want) {
		t.Errorf("flaky calls %q, want %q", flaky, want)
	}
}

// misbehaving calls next never or twice.
type misbehaving struct{ calls int }

func (misbehaving) Publish(context.Context, *outbox.Envelope) {}

func (m misbehaving) Deliver(ctx context.Context, sub string, evs []outbox.Event, next func(context.Context) error) error {
	var err error
	for range m.calls {
		err = next(ctx)
	}
	return err
}

// An interceptor that skips next fails the attempt (the handler did not
// run); one that calls next twice gets an error the second time, and the
// handler runs once.
func TestInterceptorMustCallNextOnce(t *testing.T) {
	for _, tc := range []struct {
		calls    int
		handler  int
		errorHas string
	}{{0, 0, "without calling next"}, {2, 1, "more than once"}} {
		t.Run(fmt.Sprint(tc.calls), func(t *testing.T) {
			st := outboxtest.NewStore()
			ob := quietOutbox(t, st, outbox.Config{Interceptors: []outbox.Interceptor{misbehaving{tc.calls}}})
			handled := 0
			if err := ob.Subscribe(outbox.Subscription{Name: "h", MaxAttempts: 1, Handler: func(context.Context, outbox.Event) error {
				handled++
				return nil
			}}); err != nil {
				t.Fatal(err)
			}
			var id string
			startAndDrain(t, st, ob, func(ctx context.Context, tx *outboxtest.Tx) {
				var err error
				if id, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			})
			if handled != tc.handler {
				t.Errorf("handler ran %d times, want %d", handled, tc.handler)
			}
			rec, err := ob.Inspect(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Deliveries) != 1 || rec.Deliveries[0].Status != outbox.StatusDead || !strings.Contains(rec.Deliveries[0].LastError, tc.errorHas) {
				t.Errorf("deliveries %+v, want h DEAD with an error saying %q", rec.Deliveries, tc.errorHas)
			}
		})
	}
}

// A nil interceptor is refused by New.
func TestInterceptorNil(t *testing.T) {
	_, err := outbox.New(outboxtest.NewStore(), outbox.Config{Interceptors: []outbox.Interceptor{nil}})
	if err == nil || !strings.Contains(err.Error(), "Interceptors[0] is nil") {
		t.Errorf("New with a nil interceptor: %v", err)
	}
}

// A Tx subscription's call is wrapped too, the transaction inside: the
// handler sees the interceptor's context.
func TestInterceptorWrapsTx(t *testing.T) {
	db := testdb.SQLite(t)
	st := testdb.Store(t, db)
	log := &callLog{}
	ob, err := outbox.New(st, outbox.Config{
		Logger: slog.New(slog.DiscardHandler), Interceptors: []outbox.Interceptor{&namedInterceptor{"a", log}},
		PollInterval: 50 * time.Millisecond, SkipRecent: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if err := ob.Subscribe(outbox.Subscription{Name: "tx", Tx: func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
		log.add("tx handler a=%v", ctx.Value(ctxKey("a")))
		close(done)
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer ob.Close(ctx)
	tx, err := outbox.BeginTx(ctx, db.DB, &sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "T", JSON: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the Tx handler was not called")
	}
	if err := ob.Close(ctx); err != nil {
		t.Fatal(err)
	}
	l := log.get()
	if len(l) != 4 || l[1] != "a> tx 1" || l[2] != "tx handler a=a" || l[3] != "<a <nil>" {
		t.Errorf("calls %q", l)
	}
}
