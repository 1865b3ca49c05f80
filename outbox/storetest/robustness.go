package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// hookedStore wraps a store to observe or disturb single calls. Nil hooks
// pass through.
type hookedStore struct {
	driver.Store
	driver.DeliveryStore
	claim func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error)
	// claimDeliveries replaces ClaimDeliveries.
	claimDeliveries func(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error)
	// record wraps the writes of failed deliveries (Split and
	// FailDelivery): write performs the real one.
	record func(ctx context.Context, ws []driver.DeliveryWrite, write func() (bool, error)) (bool, error)
}

func hooked(st driver.Store) *hookedStore {
	return &hookedStore{Store: st, DeliveryStore: st.(driver.DeliveryStore)}
}

func (s *hookedStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if s.claim != nil {
		return s.claim(ctx, req)
	}
	return s.Store.Claim(ctx, req)
}

func (s *hookedStore) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	if s.claimDeliveries != nil {
		return s.claimDeliveries(ctx, req, subs, f)
	}
	return s.DeliveryStore.ClaimDeliveries(ctx, req, subs, f)
}

func (s *hookedStore) Split(ctx context.Context, owner, id string, ws []driver.DeliveryWrite, registry int64) (bool, error) {
	write := func() (bool, error) { return s.DeliveryStore.Split(ctx, owner, id, ws, registry) }
	if s.record != nil {
		return s.record(ctx, ws, write)
	}
	return write()
}

func (s *hookedStore) FailDelivery(ctx context.Context, owner string, k driver.DeliveryKey, w driver.DeliveryWrite) (bool, error) {
	write := func() (bool, error) { return s.DeliveryStore.FailDelivery(ctx, owner, k, w) }
	if s.record != nil {
		return s.record(ctx, []driver.DeliveryWrite{w}, write)
	}
	return write()
}

// ownerReleasing is a hookedStore that keeps the OwnerReleaser of the
// store it wraps (a hookedStore alone hides it: Close then hands back by
// id).
type ownerReleasing struct {
	*hookedStore
	driver.OwnerReleaser
}

// releasingByOwner returns s with the wrapped store's OwnerReleaser, if
// byOwner and it has one, or else s.
func (s *hookedStore) releasingByOwner(byOwner bool) driver.Store {
	if r, ok := s.Store.(driver.OwnerReleaser); ok && byOwner {
		return ownerReleasing{s, r}
	}
	return s
}

// outboxOn is e.outbox over another store (a wrapper of e.store).
func (e *env) outboxOn(t *testing.T, st driver.Store, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	inner := e.store
	e.store = st
	defer func() { e.store = inner }()
	return e.outbox(t, cfg)
}

// An instance never marks DONE an event that a subscription elsewhere is
// owed: two instances with different listeners share the table (a
// rolling deploy), each event is delivered by the instance that has its
// listener, none is completed by the other. An event of a type that no
// subscription anywhere takes is completed at once, without a delivery;
// a subscription registered later is owed only what commits after.
func testNeverCompletesWithoutListener(t *testing.T, e *env) {
	var obs [2]*outbox.Outbox
	var recs [2]*recorder
	var ms [2]*counting
	types := [2]outbox.EventType{typeA, typeB}
	const rounds, perRound = 5, 10
	want := rounds * perRound / 2 // of each type, from both instances together
	for i := range obs {
		cfg := fastConfig()
		cfg.NoListenerDelay = 20 * time.Millisecond
		ms[i] = &counting{}
		cfg.Metrics = ms[i]
		obs[i] = e.outbox(t, cfg)
		recs[i] = newRecorder(want)
		rec, other := recs[i], types[1-i]
		obs[i].Handle("listener-"+string(types[i]), func(ctx context.Context, ev outbox.Event) error {
			if ev.Type == other {
				t.Errorf("instance %d got an event of type %s it has no listener for", i, ev.Type)
			}
			return rec.listen(ctx, ev)
		}, types[i])

		start(t, obs[i])
	}
	var ids [2][]string
	for r := range rounds {
		for k := range perRound {
			ob := obs[(r+k)%2] // each instance publishes both types
			typ := types[k%2]
			id := e.publish(t, ob, outbox.Envelope{Type: typ, JSON: []byte(payload)})
			ids[k%2] = append(ids[k%2], id)
		}
	}
	for i := range recs {
		recs[i].wait(t, wait)
	}
	for i := range obs {
		closeNow(t, obs[i])
	}
	for i, rec := range recs {
		counts, _ := rec.snapshot()
		for _, id := range ids[i] {
			if counts[id] == 0 {
				t.Errorf("event %s of type %s never delivered", id, types[i])
			}
			e.wantStatus(t, id, outbox.StatusDone)
		}
	}
	if n := strings.Count(e.logs.String(), "no listener here"); n > 2*len(types) {
		t.Errorf("%d 'no listener' warnings; want at most one per type per instance per minute", n)
	}

	// A type no subscription anywhere takes: the event is completed at
	// once (DONE, no attempt, no delivery), not claimed and handed back
	// for ever; a subscription registered later is owed only the events
	// committed after its registration. The instance here has a
	// subscription, of another type (one with none claims nothing).
	cfg := fastConfig()
	cfg.NoListenerDelay = time.Hour // a hand-back would leave it NEW
	m := &counting{}
	cfg.Metrics = m
	late := e.outbox(t, cfg)
	late.Handle("other", func(context.Context, outbox.Event) error { return nil }, "Other")
	start(t, late)
	id := e.publish(t, late, outbox.Envelope{Type: "Late", JSON: []byte(payload)})
	for deadline := time.Now().Add(wait); ; {
		if _, err := late.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec, err := e.store.(driver.Inspector).Inspect(context.Background(), id)
		if errors.Is(err, driver.ErrNotFound) {
			break // completed and deleted (DeleteDelivered)
		}
		if err == nil && rec.Status == outbox.StatusDone {
			if rec.Attempts != 0 || len(rec.Deliveries) != 0 {
				t.Fatalf("completed with %d attempts and deliveries %+v; want none", rec.Attempts, rec.Deliveries)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an event of a type no subscription takes is still %v (%v); want DONE at once", rec.Status, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := late.Subscribe(outbox.Subscription{Name: "late", Types: []outbox.EventType{"Late"}, Handler: func(context.Context, outbox.Event) error { return nil }}); !errors.Is(err, outbox.ErrStarted) {
		t.Fatalf("Subscribe after Start: %v; want ErrStarted", err)
	}
	got := make(chan outbox.Event, 2)
	next := e.outbox(t, fastConfig())
	next.Handle("late", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, "Late")
	start(t, next)
	id2 := e.publish(t, next, outbox.Envelope{Type: "Late", JSON: []byte(payload)})
	if ev := recv(t, got, "the late listener's event"); ev.ID != id2 {
		t.Fatalf("late listener got %s; want %s, committed after its registration (%s was complete before it)", ev.ID, id2, id)
	}
}

// An instance with no subscription (one that only publishes) claims
// nothing: what it claimed it could only hand back, for NoListenerDelay,
// delaying the instance that delivers it. Its polls leave the event free;
// a worker started later takes it at its first poll.
func testPublishOnlyInstanceClaimsNothing(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.NoListenerDelay = time.Hour // a hand-back would keep it from the worker
	m := &counting{}
	cfg.Metrics = m
	api := e.outbox(t, cfg)
	start(t, api)
	id := e.publish(t, api, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	for range 3 {
		n, err := api.Poll(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("the publish-only instance's poll queued %d events", n)
		}
	}
	if n := m.noListener.Load(); n != 0 {
		t.Fatalf("the publish-only instance claimed and handed back %d events", n)
	}
	got := make(chan string, 1)
	worker := e.outbox(t, fastConfig())
	worker.Handle("worker", func(_ context.Context, ev outbox.Event) error { got <- ev.ID; return nil }, typeA)
	start(t, worker)
	if d := recv(t, got, "the worker's event"); d != id {
		t.Fatalf("worker got %s; want %s", d, id)
	}
}

// Close while a claim is in flight never leaves rows leased to the closed
// instance: a claim that started finishes, and what it took is handed
// back.
func testCloseDuringClaim(t *testing.T, e *env) {
	const rows, closes = 20, 300
	free := e.outbox(t, outbox.Config{DisableHotPath: true})
	ids := e.publishMany(t, free, typeA, rows)
	stranded := 0
	for i := range closes {
		claiming := make(chan struct{}, 1)
		st := hooked(e.store)
		st.claim = func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
			select {
			case claiming <- struct{}{}:
			default:
			}
			return e.store.Claim(ctx, req)
		}
		cfg := fastConfig()
		cfg.StatsInterval = -1
		cfg.InstanceID = fmt.Sprintf("closer-%d", i)
		ob := e.outboxOn(t, st.releasingByOwner(i%2 == 0), cfg)
		ob.Handle("all", func(ctx context.Context, _ outbox.Event) error { <-ctx.Done(); return ctx.Err() })
		start(t, ob)
		<-claiming
		// Land the cancellation anywhere in the claim: at BEGIN, in the
		// SELECT, in the UPDATE or in the COMMIT (a claim takes a few
		// milliseconds). The spread is the fault injected, not a wait for
		// something to happen.
		time.Sleep(time.Duration(i%16) * 250 * time.Microsecond)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // hand back at once, do not drain
		if err := ob.Close(ctx); err != nil {
			t.Fatalf("Close %d: %v", i, err)
		}
		for _, id := range ids {
			if rec := e.inspect(t, id); rec.Owner == cfg.InstanceID {
				stranded++
			}
		}
	}
	if stranded > 0 {
		t.Fatalf("%d rows left leased to a closed instance over %d Close calls racing claims; want 0", stranded, closes)
	}
	for _, id := range ids {
		if rec := e.wantStatus(t, id, outbox.StatusNew); rec.Attempts != 0 {
			t.Fatalf("event %s: %d attempts after cancelled deliveries; want 0", id, rec.Attempts)
		}
	}
}

// A claim that the database commits after Close cut it off (the engine's
// grace period over, the claim's context cancelled; a COMMIT the driver
// could not cut short, answered late) leaves nothing leased to the closed
// instance: Close gets an already-cancelled context, and the claim
// answers, its rows leased, only once its context has ended. Both claims
// of a poll: events, and the deliveries of split events.
func testCloseAfterALateClaim(t *testing.T, e *env) {
	ids := e.insertRows(t, 20, "", 0)
	claimed := make(chan struct{}, 1)
	st := hooked(e.store)
	st.claim = func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
		return e.store.Claim(answerLate(ctx, claimed), req)
	}
	for _, byOwner := range []bool{false, true} {
		e.closeAfterLateClaim(t, st, byOwner, claimed)
		stranded := 0
		for _, id := range ids {
			if rec := e.inspect(t, id); rec.Owner != "" {
				stranded++
			}
		}
		if stranded > 0 {
			t.Fatalf("%d of %d events left leased to the closed instance after a claim that answered late (released by owner: %v); want 0", stranded, len(ids), byOwner)
		}
	}
}

func testCloseAfterALateDeliveryClaim(t *testing.T, e *env) {
	ctx := context.Background()
	ids := e.insertRows(t, 20, "setup", time.Minute)
	for _, id := range ids {
		if ok, err := e.ds().Split(ctx, "setup", id, []driver.DeliveryWrite{{Subscription: "all", Status: outbox.StatusNew}}, e.registry(t)); err != nil || !ok {
			t.Fatalf("split: %v %v", ok, err)
		}
	}
	claimed := make(chan struct{}, 1)
	st := hooked(e.store)
	st.claimDeliveries = func(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
		return e.ds().ClaimDeliveries(answerLate(ctx, claimed), req, subs, f)
	}
	for _, byOwner := range []bool{false, true} {
		e.closeAfterLateClaim(t, st, byOwner, claimed)
		stranded := 0
		for _, id := range ids {
			rec := e.inspect(t, id)
			if len(rec.Deliveries) != 1 {
				t.Fatalf("event %s: %d deliveries; want 1", id, len(rec.Deliveries))
			}
			if d := rec.Deliveries[0]; d.Owner != "" {
				stranded++
			} else if d.Attempts != 0 {
				t.Errorf("event %s: %d attempts after a cancelled delivery; want 0", id, d.Attempts)
			}
		}
		if stranded > 0 {
			t.Fatalf("%d of %d deliveries left leased to the closed instance after a claim that answered late (released by owner: %v); want 0", stranded, len(ids), byOwner)
		}
	}
}

// answerLate signals claimed, waits for ctx, a claim's, to end, and
// returns the context in which the claim is made all the same.
func answerLate(ctx context.Context, claimed chan<- struct{}) context.Context {
	select {
	case claimed <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return context.WithoutCancel(ctx)
}

// closeAfterLateClaim starts an instance over st, whose claim signals
// claimed and answers late, and closes it with a cancelled context once
// that claim is under way. With byOwner, Close may release by owner
// (driver.OwnerReleaser, if the store has it), else only by id.
func (e *env) closeAfterLateClaim(t *testing.T, st *hookedStore, byOwner bool, claimed <-chan struct{}) {
	t.Helper()
	cfg := fastConfig()
	cfg.StatsInterval = -1
	cfg.InstanceID = fmt.Sprintf("late-claimer-%v", byOwner)
	ob := e.outboxOn(t, st.releasingByOwner(byOwner), cfg)
	ob.Handle("all", func(ctx context.Context, _ outbox.Event) error { <-ctx.Done(); return ctx.Err() })
	start(t, ob)
	<-claimed
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // hand back at once, do not drain
	if err := ob.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// An event committed after its outbox was closed, or published through a
// closed outbox, is delivered by another instance at once, not after the
// publisher's lease.
func testCommitAfterClose(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.Lease = time.Minute // what the events would wait without the fix
	closing := e.outbox(t, cfg)
	closing.Handle("all", func(context.Context, outbox.Event) error {
		t.Error("the closed instance delivered")
		return nil
	})

	start(t, closing)
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	committedLate, err := closing.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		tx.Rollback()
		t.Fatal(err)
	}
	closeNow(t, closing)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	afterClose := e.publish(t, closing, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	for _, id := range []string{committedLate, afterClose} {
		if rec := e.inspect(t, id); rec.Owner != "" {
			t.Errorf("event %s still leased to %q after its outbox closed", id, rec.Owner)
		}
	}
	rec := newRecorder(2)
	other := e.outbox(t, fastConfig())
	other.Handle("all", rec.listen)
	start(t, other)
	rec.wait(t, 5*time.Second) // far less than the minute-long lease
}

// A listener error the database cannot store as it is (invalid UTF-8, a
// NUL byte) is made storable: the attempts advance and the event goes DEAD
// after MaxAttempts with a readable last_error, instead of being delivered
// again every lease. An outcome write the database refuses outright is
// recorded without the text.
func testUnstorableErrorText(t *testing.T, e *env) {
	for _, tc := range []struct{ name, text string }{
		{"invalid UTF-8", "bad bytes \xff\xfe\xc3 from the broker"},
		{"NUL", "bad bytes \x00 from the broker"},
		{"refused", "refuse-me: bad bytes from the broker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := hooked(e.store)
			refuse := func(text string) error {
				if strings.Contains(text, "refuse-me") {
					return errors.New("storetest: the database refuses this text")
				}
				return nil
			}
			cfg := fastConfig()
			cfg.MaxAttempts = 3
			ob := e.outboxOn(t, st, cfg)
			var calls atomic.Int64
			ob.Handle("all", func(context.Context, outbox.Event) error {
				calls.Add(1)
				return errors.New(tc.text)
			})

			dead := make(chan struct{})
			var once sync.Once
			st.record = func(ctx context.Context, ws []driver.DeliveryWrite, write func() (bool, error)) (bool, error) {
				if err := refuse(ws[0].Error); err != nil {
					return false, err
				}
				if ws[0].Status == outbox.StatusDead {
					defer once.Do(func() { close(dead) })
				}
				return write()
			}
			start(t, ob)
			id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
			recv(t, dead, "the event going DEAD")
			closeNow(t, ob)
			rec := e.wantStatus(t, id, outbox.StatusDead)
			if rec.Attempts != 3 || calls.Load() != 3 {
				t.Fatalf("attempts %d, listener calls %d; want 3 and 3", rec.Attempts, calls.Load())
			}
			if !utf8.ValidString(rec.LastError) || strings.ContainsRune(rec.LastError, 0) || !strings.Contains(rec.LastError, "bad bytes") && !strings.Contains(rec.LastError, "could not be stored") {
				t.Fatalf("last_error %q: want readable text", rec.LastError)
			}
		})
	}
}

// A row claimed again while its previous attempt is still finishing on
// this instance (the retry written, the worker not yet done) is queued,
// not skipped with its new lease left to expire.
func testReclaimWhileFinishing(t *testing.T, e *env) {
	written, proceed := make(chan struct{}), make(chan struct{})
	st := hooked(e.store)
	st.record = func(ctx context.Context, _ []driver.DeliveryWrite, write func() (bool, error)) (bool, error) {
		ok, err := write()
		close(written)
		<-proceed
		return ok, err
	}
	cfg := fastConfig()
	cfg.DisablePoller = true
	cfg.SkipRecent = -1
	cfg.Retry = outbox.RetryFunc(func(int) time.Duration { return 0 }) // due again at once
	ob := e.outboxOn(t, st, cfg)
	second := make(chan outbox.Event, 1)
	var calls atomic.Int64
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		second <- ev
		return nil
	})

	start(t, ob)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	recv(t, written, "the retry write")
	n, err := ob.Poll(context.Background())
	close(proceed)
	if err != nil || n != 1 {
		t.Fatalf("Poll while the first attempt finishes = %d, %v; want the event queued (1)", n, err)
	}
	if ev := recv(t, second, "the second attempt"); ev.ID != id || ev.Attempt != 2 {
		t.Fatalf("second delivery %s attempt %d", ev.ID, ev.Attempt)
	}
	closeNow(t, ob)
	e.wantStatus(t, id, outbox.StatusDone)
}

// The largest headers Publish accepts are stored and delivered byte-exact
// on every database; one byte more is refused with an error naming the
// limit.
func testLargestHeaders(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	got := make(chan outbox.Event, 1)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil })
	start(t, ob)
	// {"k":"vvv…"} is 8 bytes plus the value.
	value := strings.Repeat("v", outbox.MaxHeadersBytes-8)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": value}})
	if ev := recv(t, got, "the event with the largest headers"); ev.ID != id || ev.Headers["k"] != value {
		t.Fatalf("headers did not round-trip (%d bytes)", len(ev.Headers["k"]))
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": value + "v"}})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Headers" || !strings.Contains(err.Error(), fmt.Sprint(outbox.MaxHeadersBytes)) {
		t.Fatalf("headers one byte over the limit: %v; want a ValidationError naming the limit", err)
	}
}

// A retry runs at its back-off, not at the next poll: with the default
// 5 s poll interval and retry policy (200 ms ×0.5–1.5), the second attempt
// comes within a second of the first.
func testRetryRunsOnTime(t *testing.T, e *env) {
	ob := e.outbox(t, outbox.Config{SkipRecent: -1})
	attempts := make(chan time.Time, 2)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error {
		attempts <- time.Now()
		if ev.Attempt == 1 {
			return errors.New("first attempt fails")
		}
		return nil
	})

	start(t, ob)
	e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	first := recv(t, attempts, "the first attempt")
	second := recv(t, attempts, "the second attempt")
	if gap := second.Sub(first); gap > time.Second {
		t.Fatalf("second attempt %v after the first; want the back-off (≤ 300ms), within 1s", gap)
	}
}
