package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/txoutbox/txoutbox/outbox"
)

// kind is how a subscription takes its events.
type kind int8

const (
	plain kind = iota
	batch
	txKind
)

// spec is a subscription of the run.
type spec struct {
	name  string
	kind  kind
	order outbox.Order
	types []outbox.EventType // nil: every type
	rate  float64            // Subscription.Rate (Burst 2); 0: none
}

// circuitMaxProbe is every subscription's CircuitMaxProbe.
const circuitMaxProbe = 2 * time.Second

var eventTypes = []outbox.EventType{"A", "B", "C", "D"}

// pool are the subscriptions a run picks its base set from.
var pool = []spec{
	{name: "plain", kind: plain, types: []outbox.EventType{"A", "B"}},
	{name: "every", kind: plain},
	{name: "batch", kind: batch, types: []outbox.EventType{"A", "C"}},
	{name: "tx", kind: txKind, types: []outbox.EventType{"B", "C"}},
	{name: "ord", kind: plain, order: outbox.Ordered, types: []outbox.EventType{"A", "B"}},
	{name: "ordskip", kind: plain, order: outbox.OrderedSkipDead, types: []outbox.EventType{"A", "C"}},
	{name: "ordtx", kind: txKind, order: outbox.Ordered, types: []outbox.EventType{"C"}},
	// Slow enough that their gates fill and defer events to the table.
	{name: "limited", kind: plain, types: []outbox.EventType{"A", "B", "D"}, rate: 5},
	{name: "ordlimited", kind: txKind, order: outbox.Ordered, types: []outbox.EventType{"B", "D"}, rate: 5},
	{name: "batchlimited", kind: batch, types: []outbox.EventType{"C", "D"}, rate: 5},
}

// extras are the subscriptions a rolling deploy adds.
var extras = []spec{
	{name: "late", kind: plain, types: []outbox.EventType{"A", "B", "C"}},
	{name: "lateord", kind: plain, order: outbox.Ordered, types: []outbox.EventType{"A"}},
	{name: "latebatch", kind: batch},
}

func pickSpecs(rng *rand.Rand) []spec {
	var out []spec
	for _, sp := range pool {
		if rng.IntN(2) == 0 {
			out = append(out, sp)
		}
	}
	if len(out) == 0 {
		out = append(out, pool[rng.IntN(len(pool))])
	}
	return out
}

func specNames(ss []spec) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = s.name
	}
	return "[" + strings.Join(names, " ") + "]"
}

func (s spec) takes(t outbox.EventType) bool {
	if s.types == nil {
		return true
	}
	for _, x := range s.types {
		if x == t {
			return true
		}
	}
	return false
}

type payload struct {
	N   int    `json:"n"`
	Tok string `json:"t"`
}

func number(ev outbox.Event) int { return read(ev).N }

func read(ev outbox.Event) payload {
	var p payload
	if err := json.Unmarshal(ev.JSON, &p); err != nil {
		panic(fmt.Sprintf("sim: payload %q: %v", ev.JSON, err))
	}
	return p
}

// newID returns the next event id of nd's producer: a ULID of the virtual
// time with entropy from the producer's stream (the engine's own ids take
// theirs from crypto/rand, and claims order by id).
func (nd *node) newID() string {
	var entropy [10]byte
	a, b := nd.rng.uint64(), nd.rng.uint64()
	binary.BigEndian.PutUint64(entropy[:8], a)
	binary.BigEndian.PutUint16(entropy[8:], uint16(b))
	var id ulid.ULID
	if err := id.SetTime(ulid.Timestamp(time.Now())); err != nil {
		panic(err)
	}
	if err := id.SetEntropy(entropy[:]); err != nil {
		panic(err)
	}
	return id.String()
}

// subscription builds the node's Subscription for spec sp.
func (nd *node) subscription(sp spec) outbox.Subscription {
	s := outbox.Subscription{Name: sp.name, Types: sp.types, Order: sp.order,
		CircuitThreshold: 2, CircuitProbe: 100 * time.Millisecond, CircuitMaxProbe: circuitMaxProbe}
	if sp.rate > 0 {
		s.Rate, s.Burst = sp.rate, 2
	}
	switch sp.kind {
	case plain:
		s.Handler = func(ctx context.Context, ev outbox.Event) error {
			return nd.w.deliver(ctx, nd, sp, ev, nil)
		}
	case txKind:
		s.Tx = func(ctx context.Context, tx outbox.DBTx, ev outbox.Event) error {
			return nd.w.deliver(ctx, nd, sp, ev, func() error {
				_, err := tx.ExecContext(ctx, "effect", number(ev))
				return err
			})
		}
	case batch:
		s.BatchSize = 4
		s.Batch = func(ctx context.Context, evs []outbox.Event) error {
			errs := make([]error, len(evs))
			failed := false
			for i, ev := range evs {
				errs[i] = nd.w.deliver(ctx, nd, sp, ev, nil)
				failed = failed || errs[i] != nil
			}
			if !failed {
				return nil
			}
			return &outbox.BatchError{Errs: errs}
		}
	}
	return s
}

// outcomes of a handler call.
const (
	succeed = iota
	fail
	failForGood
	slow
	hang
	panics
)

// outcome decides a call's fate from the seed, the subscription, the
// event and the attempt: the same call fails the same way whenever it
// runs.
func (w *world) outcome(sub, tok string, attempt int) int {
	u := w.hash("call", sub, tok, attempt)
	if u >= w.knobs.failRate {
		if w.hash("slow", sub, tok, attempt) < 0.1 {
			return slow
		}
		return succeed
	}
	u /= w.knobs.failRate
	switch {
	case u < 0.55:
		return fail
	case u < 0.7:
		return failForGood
	case u < 0.85:
		return hang
	default:
		return panics
	}
}

var errHandler = errors.New("sim: handler failed")

// deliver is every subscription's handler: it records the call, checks
// the order promises and acts out the call's outcome. effect, for a Tx
// subscription, writes through the transaction.
func (w *world) deliver(ctx context.Context, nd *node, sp spec, ev outbox.Event, effect func() error) (err error) {
	// A call that waited out a freeze is a zombie: its lease may have
	// run out meanwhile.
	frozen := nd.pause()
	if nd.crashed.Load() {
		<-ctx.Done() // a dead process calls nothing
		return errCrashed
	}
	p := read(ev)
	n := p.N
	c := w.begin(nd, sp, ev, n, frozen)
	defer func() {
		if r := recover(); r != nil {
			w.end(c, false)
			panic(r)
		}
		w.end(c, err == nil)
	}()
	if w.down(sp.name) {
		return outbox.Unavailable(fmt.Errorf("sim: %s is down", sp.name), 0)
	}
	switch w.outcome(sp.name, p.Tok, ev.Attempt) {
	case fail:
		return errHandler
	case failForGood:
		return outbox.Permanent(errHandler)
	case panics:
		panic("sim: handler panics")
	case hang:
		<-ctx.Done()
		return ctx.Err()
	case slow:
		t := time.NewTimer(w.cfg.ListenerTimeout / 2)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	nd.pause()
	if effect != nil {
		return effect()
	}
	return nil
}

// down reports whether sub's destination has an outage now.
func (w *world) down(sub string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.faultsOff && w.outages[sub] > w.now()
}

// produce runs the node's producer until its stop channel closes:
// transactions of 1 to maxTxEvents events, most committed, some rolled
// back, some committed late.
func (nd *node) produce(wg *sync.WaitGroup) {
	wg.Go(func() {
		for {
			t := time.NewTimer(nd.rng.dur(nd.w.knobs.txGap/2, nd.w.knobs.txGap*3/2))
			select {
			case <-nd.stopP:
				t.Stop()
				return
			case <-nd.w.faultsEnd:
				t.Stop()
				return
			case <-t.C:
			}
			nd.pause()
			if !nd.alive() {
				return
			}
			nd.transact()
		}
	})
}

func (nd *node) transact() {
	w := nd.w
	ctx := context.Background()
	tx := w.store.Begin(ctx)
	k := 1 + nd.rng.intn(w.knobs.maxTxEvents)
	var evs []*event
	for range k {
		e := w.newEvent(nd)
		env := outbox.Envelope{ID: nd.newID(), Type: e.typ, JSON: json.RawMessage(fmt.Sprintf(`{"n":%d,"t":%q}`, e.n, e.tok)), OrderingKey: e.key}
		if e.key != "" {
			env.AggregateType, env.AggregateID = "agg", e.key
		}
		id, err := nd.ob.PublishTx(ctx, tx, env)
		if err != nil {
			w.logf("%s: publish #%d: %v", nd.name, e.n, err)
			break
		}
		w.mu.Lock()
		e.id = id
		w.byID[id] = e
		w.mu.Unlock()
		evs = append(evs, e)
	}
	switch r := nd.rng.intn(100); {
	case r < 12 || len(evs) < k:
		w.settleTx(evs, rollingBack, 0)
		tx.Rollback()
		w.settleTx(evs, rolledBack, 0)
		w.logf("%s: rolled back %s", nd.name, eventList(evs))
		return
	case r < 16:
		time.Sleep(w.cfg.Lease/2 + nd.rng.dur(0, w.cfg.Lease))
	}
	start := w.nextTick()
	w.settleTx(evs, committing, start)
	if err := tx.Commit(); err != nil {
		w.settleTx(evs, rolledBack, 0)
		w.logf("%s: commit failed %s: %v", nd.name, eventList(evs), err)
		return
	}
	w.settleTx(evs, committed, start)
	w.logf("%s: committed %s", nd.name, eventList(evs))
}

// newEvent makes the next event of nd's producer: its type and key from
// the producer's stream, its token (what its handler outcomes are drawn
// by) from the producer's count, so that neither depends on what other
// nodes did meanwhile; its number, for the trace, from the run's count.
func (w *world) newEvent(nd *node) *event {
	nd.made++
	typ := w.types[nd.rng.intn(len(w.types))]
	key := ""
	if nd.rng.intn(4) > 0 {
		key = fmt.Sprintf("k%d", 1+nd.rng.intn(w.knobs.keys))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	e := &event{n: len(w.events) + 1, tok: fmt.Sprintf("%s/%d", nd.name, nd.made), typ: typ, key: key, node: nd.name}
	w.events = append(w.events, e)
	return e
}

func (w *world) settleTx(evs []*event, state txState, start int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range evs {
		e.state, e.commitStart = state, start
	}
}

func eventList(evs []*event) string {
	var b strings.Builder
	for i, e := range evs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "#%d/%s/%s", e.n, e.typ, e.key)
	}
	return b.String()
}
