package sim

import (
	"cmp"
	"context"
	"fmt"
	"iter"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// registered notes the subscriptions a node's sync has just recorded in
// the store: events whose commit starts after this are owed to them.
func (w *world) registered(subs []driver.SubscriptionInfo) {
	t := w.nextTick()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range subs {
		if w.regAt[s.Name] == 0 {
			w.regAt[s.Name] = t
			w.logLocked("registered %s", s.Name)
		}
	}
}

// keySeq returns the event's number in its key (0: not ordered),
// read from the store once.
func (w *world) keySeq(id string) int64 {
	rec, err := w.store.Inspect(context.Background(), id)
	if err != nil {
		return 0
	}
	return rec.KeySeq
}

// begin records the start of a handler call and checks the promises
// that hold at that moment: the event committed, and no other event of
// its key in flight to an ordered subscription.
func (w *world) begin(nd *node, sp spec, ev outbox.Event, n int, frozen bool) *call {
	seq := int64(0)
	if sp.order != outbox.Unordered {
		seq = w.keySeq(ev.ID)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.events[n-1]
	c := &call{sub: sp.name, n: n, key: e.key, node: nd, attempt: ev.Attempt, start: w.now(), running: true,
		zombie: frozen}
	w.calls = append(w.calls, c)
	{ // always: a failing seed keeps the trace's tail
		w.logLocked("%s: deliver #%d (key %q seq %d) to %s, attempt %d", nd.name, n, e.key, seq, sp.name, ev.Attempt)
	}
	if e.state != committed && e.state != committing {
		w.violateLocked("event #%d (%s) delivered to %s on %s, but its transaction %s", n, ev.ID, sp.name, nd.name, stateNames[e.state])
	}
	if seq > 0 {
		k := sp.name + "|" + e.key
		for _, o := range w.inflight[k] {
			// Two calls of one event to a Tx subscription may overlap: a
			// call held inside DeliverInTx (a freeze longer than the
			// lease) after its lease check, beside the instance that took
			// the delivery over. Each runs in its transaction and the
			// delivery's record lets one commit (the Tx check counts the
			// effects), so the effect is once and in key order; calls of
			// two events of a key still may not overlap (seeds 523, 9264;
			// docs/design/simulation.md item 12).
			sameTx := sp.kind == txKind && o.n == n
			if o.running && !o.zombie && !c.zombie && !sameTx {
				w.violateLocked("two events of key %s in flight to ordered %s: #%d (attempt %d, on %s since %.3fs) and #%d (attempt %d, on %s)",
					e.key, sp.name, o.n, o.attempt, o.node.name, o.start.Seconds(), n, ev.Attempt, nd.name)
			}
		}
		w.inflight[k] = append(slices.DeleteFunc(w.inflight[k], func(o *call) bool { return !o.running }), c)
	}
	return c
}

// end records the end of a call.
func (w *world) end(c *call, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c.running = false
	c.ok = ok && !c.node.crashed.Load()
	{ // always: a failing seed keeps the trace's tail
		w.logLocked("%s: #%d to %s, attempt %d: ok=%v", c.node.name, c.n, c.sub, c.attempt, c.ok)
	}
}

// zombify marks the node's running calls: their instance crashed or
// froze, so its lease may run out while they run.
func (w *world) zombify(nd *node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.calls {
		if c.node == nd && c.running {
			c.zombie = true
		}
	}
}

// settle waits, once faults have stopped, until nothing owed is pending,
// and reports what is still pending after the bound.
func (w *world) settle() {
	bound := w.bound()
	deadline := w.now() + bound
	for {
		problems, pending := w.owed()
		if pending == 0 || w.now() >= deadline {
			w.mu.Lock()
			for _, p := range problems {
				w.violateLocked("%s", p)
			}
			w.logLocked("settled: %d problems, %d pending, bound %v", len(problems), pending, bound)
			w.mu.Unlock()
			if pending > 0 {
				w.dumpKeys()
				if os.Getenv("SIM_STACKS") != "" {
					buf := make([]byte, 1<<22)
					os.Stderr.Write(buf[:runtime.Stack(buf, true)])
				}
			}
			w.checkOrder()
			return
		}
		time.Sleep(time.Second)
	}
}

// bound is Bound for this run.
func (w *world) bound() time.Duration {
	w.mu.Lock()
	perKey := map[string]int{}
	longest := 0
	for _, e := range w.events {
		if e.state == committed && e.key != "" {
			perKey[e.key]++
			longest = max(longest, perKey[e.key])
		}
	}
	w.mu.Unlock()
	return Bound(w.cfg, time.Second, longest)
}

// owed checks every committed event against every subscription it is
// owed to: delivered (a Tx subscription: its effect committed once), or
// dead, or waiting behind a dead event of its key for a blocking ordered
// subscription. It returns the losses and those pending, and how many
// are pending.
func (w *world) owed() (problems []string, pending int) {
	ctx := context.Background()
	blocked := w.blocked()
	effects := map[string]int{}
	for _, ef := range w.store.TxEffects() {
		effects[ef.EventID+"/"+ef.Subscription]++
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delivered := map[string]bool{}
	for _, c := range w.calls {
		if c.ok {
			delivered[fmt.Sprint(c.n, "/", c.sub)] = true
		}
	}
	for _, e := range w.events {
		if e.state != committed {
			continue
		}
		if !w.takenLocked(e.typ) {
			if p := w.unowned(ctx, e); p != "" {
				pending++
				problems = append(problems, p)
			}
			continue
		}
		var rec outbox.Record
		var recErr error
		read := false // rec is read once, for the first owed delivery not made
		for _, sp := range w.specs {
			reg := w.regAt[sp.name]
			if !sp.takes(e.typ) || reg == 0 || reg >= e.commitStart {
				continue
			}
			if sp.kind == txKind {
				if n := effects[e.id+"/"+sp.name]; n > 1 {
					problems = append(problems, fmt.Sprintf("event #%d (%s): Tx subscription %s committed its effect %d times", e.n, e.id, sp.name, n))
					continue
				} else if n == 1 {
					continue
				}
			} else if delivered[fmt.Sprint(e.n, "/", sp.name)] {
				continue
			}
			if !read {
				rec, recErr = w.store.Inspect(ctx, e.id)
				read = true
			}
			if recErr != nil {
				problems = append(problems, fmt.Sprintf("event #%d (%s): %v", e.n, e.id, recErr))
				continue
			}
			if sp.kind == txKind && w.effectSince(e.id, sp.name) {
				// Its effect committed after the effects were read, and
				// before the record the event has now (the engines run on
				// while this looks).
				continue
			}
			p, pend := w.judge(e, sp, rec, blocked)
			if pend {
				pending++
			}
			if p != "" {
				problems = append(problems, p)
			}
		}
	}
	return problems, pending
}

// effectSince reports whether the effect of event id for Tx subscription
// sub has committed, as the store says now.
func (w *world) effectSince(id, sub string) bool {
	for _, ef := range w.store.TxEffects() {
		if ef.EventID == id && ef.Subscription == sub {
			return true
		}
	}
	return false
}

// takenLocked reports whether a subscription of the run takes type t
// (w.mu held).
func (w *world) takenLocked(t outbox.EventType) bool {
	for _, sp := range w.specs {
		if sp.takes(t) {
			return true
		}
	}
	return false
}

// unowned checks e, an event of a type no subscription of the run takes:
// it must be completed (at once, by the first instance that claims it),
// not left NEW or handed back for ever.
func (w *world) unowned(ctx context.Context, e *event) string {
	rec, err := w.store.Inspect(ctx, e.id)
	if err != nil {
		return fmt.Sprintf("event #%d (%s): %v", e.n, e.id, err)
	}
	if rec.Status == outbox.StatusNew || rec.Status == outbox.StatusRetry {
		return fmt.Sprintf("PENDING: event #%d (%s, type %s) that no subscription takes is still %v (owner %q) after the bound", e.n, e.id, e.typ, rec.Status, rec.Owner)
	}
	return ""
}

// judge tells, for an event not delivered to sp, whether that is
// allowed (dead, skipped, blocked), a loss, or pending.
func (w *world) judge(e *event, sp spec, rec outbox.Record, blocked map[string]int64) (problem string, pending bool) {
	where := fmt.Sprintf("event #%d (%s, type %s, key %q, seq %d, published on %s) for subscription %s", e.n, e.id, e.typ, e.key, rec.KeySeq, e.node, sp.name)
	if rec.Status == outbox.StatusDead {
		return "", false
	}
	var d *driver.DeliveryRecord
	for i := range rec.Deliveries {
		if rec.Deliveries[i].Subscription == sp.name {
			d = &rec.Deliveries[i]
		}
	}
	status := rec.Status
	if d != nil {
		status = d.Status
	} else if rec.Status == driver.StatusSplit {
		return "LOST: " + where + ": the event is split without a delivery for it; deliveries: " + deliveries(rec), false
	}
	switch status {
	case outbox.StatusDead:
		return "", false
	case outbox.StatusDone:
		if w.skipped[e.id] {
			return "", false
		}
		return "LOST: " + where + ": recorded DONE, never delivered to it", false
	}
	if b := blocked[sp.name+"|"+e.key]; sp.order == outbox.Ordered && b > 0 && rec.KeySeq > b {
		return "", false
	}
	return fmt.Sprintf("PENDING: %s: %s (owner %q, attempts %d) after the bound", where, status, rec.Owner, rec.Attempts), true
}

// dumpKeys writes the state of every ordered event to the trace, key by
// key, to show what holds a stalled key.
func (w *world) dumpKeys() {
	for e, rec := range w.numbered() {
		w.logf("key %s seq %d: #%d %s type %s, %s owner %q attempts %d, deliveries %s", e.key, rec.KeySeq, e.n, e.id, e.typ, rec.Status, rec.Owner, rec.Attempts, deliveries(rec))
	}
}

// numbered yields the committed events numbered in their key, with
// their records as the store has them now.
func (w *world) numbered() iter.Seq2[*event, outbox.Record] {
	w.mu.Lock()
	evs := slices.Clone(w.events)
	w.mu.Unlock()
	return func(yield func(*event, outbox.Record) bool) {
		for _, e := range evs {
			if e.state != committed || e.key == "" {
				continue
			}
			rec, err := w.store.Inspect(context.Background(), e.id)
			if err != nil || rec.KeySeq == 0 {
				continue
			}
			if !yield(e, rec) {
				return
			}
		}
	}
}

func deliveries(rec outbox.Record) string {
	var out []string
	for _, d := range rec.Deliveries {
		out = append(out, fmt.Sprintf("%s=%s/%d", d.Subscription, d.Status, d.Attempts))
	}
	return fmt.Sprint(out)
}

// blocked returns, as subscription|key, the keys blocked for a blocking
// ordered subscription, with the number of the dead event that blocks
// each: an event of the key dead for it (or dead as a whole) and not
// skipped. Events after that number wait for it, by design.
func (w *world) blocked() map[string]int64 {
	specs := w.specsNow()
	out := map[string]int64{}
	for e, rec := range w.numbered() {
		for _, sp := range specs {
			if sp.order != outbox.Ordered || !sp.takes(e.typ) {
				continue
			}
			dead := rec.Status == outbox.StatusDead
			for _, d := range rec.Deliveries {
				dead = dead || (d.Subscription == sp.name && d.Status == outbox.StatusDead)
			}
			k := sp.name + "|" + e.key
			if dead && (out[k] == 0 || rec.KeySeq < out[k]) {
				out[k] = rec.KeySeq
			}
		}
	}
	return out
}

func (w *world) specsNow() []spec {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.specs)
}

// checkOrder checks, per ordered subscription and key, that the first
// delivery of each event came in the key's order.
func (w *world) checkOrder() {
	w.mu.Lock()
	calls := slices.Clone(w.calls)
	specs := slices.Clone(w.specs)
	w.mu.Unlock()
	ordered := map[string]bool{}
	for _, sp := range specs {
		ordered[sp.name] = sp.order != outbox.Unordered
	}
	slices.SortStableFunc(calls, func(a, b *call) int { return cmp.Compare(a.start, b.start) })
	type last struct {
		n   int
		seq int64
	}
	seqs := map[int]int64{}
	highest := map[string]last{}
	seen := map[string]bool{}
	for _, c := range calls {
		if !ordered[c.sub] || c.key == "" || c.zombie {
			continue
		}
		first := fmt.Sprint(c.n, "/", c.sub)
		if seen[first] {
			continue
		}
		seen[first] = true
		seq, ok := seqs[c.n]
		if !ok {
			w.mu.Lock()
			id := w.events[c.n-1].id
			w.mu.Unlock()
			seq = w.keySeq(id)
			seqs[c.n] = seq
		}
		if seq == 0 {
			continue
		}
		k := c.sub + "|" + c.key
		if h := highest[k]; seq < h.seq {
			w.violate("ordered %s, key %s: first delivery of #%d (seq %d) at %.3fs on %s came after that of #%d (seq %d)",
				c.sub, c.key, c.n, seq, c.start.Seconds(), c.node.name, h.n, h.seq)
		} else {
			highest[k] = last{c.n, seq}
		}
	}
}

// awaitStragglers lets a virtual minute pass after closeAll, so that the
// goroutines a Close gave up on end inside the bubble. Close does not wait
// past its grace for a part inside a store call that ignores its context
// (a frozen node's calls do, in pause), as documented: that goroutine ends
// when the call returns, which from closeAll on is within a step of
// pause. Without this, Run could return before it, and the bubble panic
// with "blocked goroutines remain" (seeds of 15001–20000 at e732fdb, the
// whole chunk lost with the seed unknown). Nothing else runs then: every
// check is done, and with no goroutine left the sleep changes nothing. A
// goroutine still blocked after it is a leak, and the bubble reports it.
func (w *world) awaitStragglers() {
	time.Sleep(time.Minute)
}

// closeAll closes every live node with time enough, checks that none
// left a row leased to itself, and lets the crashed ones end.
func (w *world) closeAll() {
	// No node waits in a freeze from here on, whatever froze it: a
	// goroutine of a crashed node left in pause() would outlive the
	// bubble (CI's run of session 23 panicked with "blocked goroutines
	// remain", a registrar in pause; its seed is not known).
	w.ending.Store(true)
	w.mu.Lock()
	nodes := slices.Clone(w.nodes)
	w.mu.Unlock()
	for _, nd := range nodes {
		nd.frozen.Store(0)
	}
	for _, nd := range nodes {
		if nd.alive() {
			nd.close(10 * time.Second)
		}
	}
	for _, nd := range nodes {
		nd.closeWG.Wait()
	}
	for _, nd := range nodes {
		if nd.crashed.Load() {
			close(nd.reaped)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			nd.ob.Close(ctx)
		}
	}
}
