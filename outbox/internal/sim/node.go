package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// node is one instance: an engine over the shared store, seen through a
// store of its own that injects this instance's faults.
type node struct {
	w    *world
	name string
	rng  *stream // its producer's draws
	made int     // events its producer made (the producer's own)
	ob   *outbox.Outbox
	subs []spec
	st   *faultyStore

	crashed atomic.Bool
	closed  atomic.Bool  // Close called
	frozen  atomic.Int64 // virtual time the freeze ends
	// reaped: the crashed node's blocked store calls may return (with
	// an error, changing nothing) so that its goroutines end.
	reaped   chan struct{}
	stopP    chan struct{} // stops the producer
	closeWG  sync.WaitGroup
	replaced bool // a new node took its place (guarded by the director)
}

// dead is a crashed node's store call: it changes nothing and does not
// answer until the caller gives up or the run reaps the node.
func (nd *node) dead(ctx context.Context) error {
	select {
	case <-nd.reaped:
	case <-ctx.Done():
	}
	return errCrashed
}

func (nd *node) alive() bool { return !nd.crashed.Load() && !nd.closed.Load() }

var errCrashed = errors.New("sim: the instance crashed")
var errStore = errors.New("sim: store error")

// startNode starts an instance with the given subscriptions.
func (w *world) startNode(subs []spec, joined bool) *node {
	w.mu.Lock()
	name := fmt.Sprintf("n%d", len(w.nodes)+1)
	w.mu.Unlock()
	nd := &node{w: w, name: name, rng: newStream(w.seed, name), subs: subs, reaped: make(chan struct{}), stopP: make(chan struct{})}
	nd.st = &faultyStore{Store: w.store, nd: nd}
	cfg := w.cfg
	cfg.InstanceID = name
	ob, err := outbox.New(nd.st, cfg)
	if err != nil {
		panic(err)
	}
	nd.ob = ob
	for _, sp := range subs {
		if err := ob.Subscribe(nd.subscription(sp)); err != nil {
			panic(err)
		}
	}
	w.mu.Lock()
	w.nodes = append(w.nodes, nd)
	w.mu.Unlock()
	for {
		err := ob.Start(context.Background())
		if err == nil {
			break
		}
		w.logf("%s: start: %v (again)", name, err)
		time.Sleep(100 * time.Millisecond)
	}
	w.logf("%s started with %s (joined %v)", name, specNames(subs), joined)
	return nd
}

// crash stops the node without Close: its store calls block from now on
// and change nothing, its handlers' calls count for nothing.
func (nd *node) crash() {
	nd.crashed.Store(true)
	close(nd.stopP)
	nd.w.zombify(nd)
	nd.w.logf("%s CRASHED", nd.name)
}

// close calls Close with a context that ends after d (d ≤ 0: already
// ended), in the background, and checks what Close left leased.
func (nd *node) close(d time.Duration) {
	if !nd.closed.CompareAndSwap(false, true) {
		return
	}
	close(nd.stopP)
	nd.w.logf("%s Close(%v)", nd.name, d)
	nd.closeWG.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		err := nd.ob.Close(ctx)
		left := nd.w.store.Leased(nd.name)
		nd.w.logf("%s closed: err=%v, leased=%d", nd.name, err, len(left))
		if len(left) > 0 && !nd.st.faulted.Load() {
			nd.w.violate("%s closed (Close(%v) returned %v) and left %d rows leased to itself: %v", nd.name, d, err, len(left), first(left, 5))
		}
	})
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// freeze stops the node's clock for d: every store call and handler call
// it makes meanwhile waits until d has passed (a long GC pause, a frozen
// VM).
func (nd *node) freeze(d time.Duration) {
	nd.frozen.Store(int64(nd.w.now() + d))
	if d > nd.w.cfg.Lease/2 {
		nd.w.zombify(nd)
	}
	nd.w.logf("%s FROZEN for %v", nd.name, d)
}

// pause waits while the node is frozen, in steps, so that a thaw (heal)
// ends the wait, and reports whether it waited.
func (nd *node) pause() (waited bool) {
	for {
		d := time.Duration(nd.frozen.Load()) - nd.w.now()
		if d <= 0 || nd.w.ending.Load() {
			return waited
		}
		time.Sleep(min(d, 100*time.Millisecond))
		waited = true
	}
}

// faultyStore is the shared store as one node sees it: slow, failing
// before or after a write took effect, blocking once the node crashed.
type faultyStore struct {
	*outboxtest.Store
	nd *node
	// faulted: a store error was injected while the node was closing, so
	// what Close left leased is not Close's doing.
	faulted atomic.Bool
	mu      sync.Mutex
	calls   map[string]int // calls so far, per method: see draw
}

// draw is a number in [0, 1) for the n-th call of method by this node,
// in phase ("before", "after", "slow"): store faults are drawn by the
// call, not from a stream shared by every goroutine of the run, so that
// one node's calls coming in another order at one virtual instant change
// the faults of that method on that node only.
func (f *faultyStore) draw(method, phase string) float64 {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	if phase == "before" {
		f.calls[method]++
	}
	n := f.calls[method]
	f.mu.Unlock()
	return f.nd.w.hash("store", f.nd.name, method, phase, n)
}

// before runs before every call: it waits while the node is frozen or
// slow, blocks a crashed node's call until it is reaped, and may fail the
// call before it takes effect.
func (f *faultyStore) before(ctx context.Context, method string) error {
	nd, w := f.nd, f.nd.w
	nd.pause()
	if nd.crashed.Load() {
		return nd.dead(ctx)
	}
	w.mu.Lock()
	off := w.faultsOff
	w.mu.Unlock()
	if off {
		return nil
	}
	if s := w.knobs.slowStore; s > 0 {
		time.Sleep(time.Duration(f.draw(method, "slow") * float64(s)))
	}
	if nd.crashed.Load() {
		return nd.dead(ctx)
	}
	if w.knobs.storeErr > 0 && f.draw(method, "before") < w.knobs.storeErr/2 {
		f.markFault()
		return errStore
	}
	return nil
}

// after runs after a call took effect: it may report an error anyway (a
// COMMIT whose outcome the caller never learnt).
func (f *faultyStore) after(method string) error {
	w := f.nd.w
	w.mu.Lock()
	off := w.faultsOff
	w.mu.Unlock()
	if off || w.knobs.storeErr == 0 || f.draw(method, "after") >= w.knobs.storeErr/2 {
		return nil
	}
	f.markFault()
	return fmt.Errorf("%w after the write took effect", errStore)
}

func (f *faultyStore) markFault() {
	if f.nd.closed.Load() {
		f.faulted.Store(true)
	}
}

// wrap runs a write with the node's faults.
func wrap[T any](ctx context.Context, f *faultyStore, method string, call func() (T, error)) (T, error) {
	var zero T
	if err := f.before(ctx, method); err != nil {
		return zero, err
	}
	v, err := call()
	if err != nil {
		return v, err
	}
	if err := f.after(method); err != nil {
		return zero, err
	}
	return v, nil
}

// claimWrap runs a claim: an error after it took effect undoes it first,
// as the store contract asks (a claim that failed leased nothing).
func claimWrap[T any](ctx context.Context, f *faultyStore, method string, call func() ([]T, error), undo func([]T)) ([]T, error) {
	if err := f.before(ctx, method); err != nil {
		return nil, err
	}
	v, err := call()
	if err != nil {
		return v, err
	}
	if err := f.after(method); err != nil {
		undo(v)
		return nil, err
	}
	return v, nil
}

func (f *faultyStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	rows, err := claimWrap(ctx, f, "Claim", func() ([]driver.Row, error) { return f.Store.Claim(ctx, req) }, func(rows []driver.Row) {
		f.Store.Release(context.Background(), req.Owner, rowIDs(rows), 0)
	})
	f.claimed("claim", rowIDs(rows), "")
	return rows, err
}

func (f *faultyStore) ClaimHeads(ctx context.Context, req driver.ClaimRequest, keys []string, of driver.OrderFilter) ([]driver.Row, error) {
	rows, err := claimWrap(ctx, f, "ClaimHeads", func() ([]driver.Row, error) { return f.Store.ClaimHeads(ctx, req, keys, of) }, func(rows []driver.Row) {
		f.Store.Release(context.Background(), req.Owner, rowIDs(rows), 0)
	})
	f.claimed("claim heads", rowIDs(rows), "")
	return rows, err
}

func (f *faultyStore) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, of driver.OrderFilter) ([]driver.Delivery, error) {
	ds, err := claimWrap(ctx, f, "ClaimDeliveries", func() ([]driver.Delivery, error) { return f.Store.ClaimDeliveries(ctx, req, subs, of) }, func(ds []driver.Delivery) {
		keys := make([]driver.DeliveryID, len(ds))
		for i, d := range ds {
			keys[i] = driver.DeliveryID{EventID: d.ID, Subscription: d.Subscription}
		}
		f.Store.ReleaseDeliveries(context.Background(), req.Owner, keys, 0)
	})
	for _, d := range ds {
		f.claimed("claim delivery", []string{d.ID}, d.Subscription)
	}
	return ds, err
}

// claimed writes what a claim leased to the node into the trace (whose
// tail a failing seed keeps: see traceKeep).
func (f *faultyStore) claimed(what string, ids []string, sub string) {
	if len(ids) == 0 {
		return
	}
	w := f.nd.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, id := range ids {
		if e := w.byID[id]; e != nil {
			fmt.Fprintf(&b, " #%d", e.n)
		} else {
			b.WriteString(" " + id)
		}
	}
	if sub != "" {
		b.WriteString(" for " + sub)
	}
	w.logLocked("%s: %s%s", f.nd.name, what, b.String())
}

func rowIDs(rows []driver.Row) []string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

func (f *faultyStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	return wrap(ctx, f, "MarkDone", func() (int, error) { return f.Store.MarkDone(ctx, owner, ids, registry) })
}

func (f *faultyStore) MarkRetry(ctx context.Context, owner, id string, delay time.Duration, errText string) (bool, error) {
	return wrap(ctx, f, "MarkRetry", func() (bool, error) { return f.Store.MarkRetry(ctx, owner, id, delay, errText) })
}

func (f *faultyStore) MarkDead(ctx context.Context, owner, id string, errText string) (bool, error) {
	return wrap(ctx, f, "MarkDead", func() (bool, error) { return f.Store.MarkDead(ctx, owner, id, errText) })
}

func (f *faultyStore) ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error) {
	return wrap(ctx, f, "ExtendLeases", func() (int, error) { return f.Store.ExtendLeases(ctx, owner, ids, lease) })
}

func (f *faultyStore) Release(ctx context.Context, owner string, ids []string, delay time.Duration) error {
	_, err := wrap(ctx, f, "Release", func() (struct{}, error) { return struct{}{}, f.Store.Release(ctx, owner, ids, delay) })
	return err
}

func (f *faultyStore) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	return wrap(ctx, f, "SyncSubscriptions", func() (driver.Registration, error) {
		st, err := f.Store.SyncSubscriptions(ctx, subs)
		if err == nil {
			f.nd.w.registered(subs)
		}
		return st, err
	})
}

func (f *faultyStore) SetPaused(ctx context.Context, name string, paused bool) (bool, error) {
	return wrap(ctx, f, "SetPaused", func() (bool, error) { return f.Store.SetPaused(ctx, name, paused) })
}

func (f *faultyStore) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	return wrap(ctx, f, "Split", func() ([]bool, error) { return f.Store.Split(ctx, owner, splits, registry) })
}

func (f *faultyStore) CompleteDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID) (int, error) {
	return wrap(ctx, f, "CompleteDeliveries", func() (int, error) { return f.Store.CompleteDeliveries(ctx, owner, keys) })
}

func (f *faultyStore) FailDelivery(ctx context.Context, owner string, key driver.DeliveryID, dw driver.DeliveryWrite) (bool, error) {
	return wrap(ctx, f, "FailDelivery", func() (bool, error) { return f.Store.FailDelivery(ctx, owner, key, dw) })
}

func (f *faultyStore) ExtendDeliveryLeases(ctx context.Context, owner string, keys []driver.DeliveryID, lease time.Duration) (int, error) {
	return wrap(ctx, f, "ExtendDeliveryLeases", func() (int, error) { return f.Store.ExtendDeliveryLeases(ctx, owner, keys, lease) })
}

func (f *faultyStore) ReleaseDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID, delay time.Duration) error {
	_, err := wrap(ctx, f, "ReleaseDeliveries", func() (struct{}, error) { return struct{}{}, f.Store.ReleaseDeliveries(ctx, owner, keys, delay) })
	return err
}

func (f *faultyStore) DueNow(ctx context.Context, sub string) (int, error) {
	return wrap(ctx, f, "DueNow", func() (int, error) { return f.Store.DueNow(ctx, sub) })
}

func (f *faultyStore) KeysDone(ctx context.Context, evs []driver.KeyDone, of driver.OrderFilter) error {
	_, err := wrap(ctx, f, "KeysDone", func() (struct{}, error) { return struct{}{}, f.Store.KeysDone(ctx, evs, of) })
	return err
}

func (f *faultyStore) MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []driver.KeyDone, registry int64) (int, []string, error) {
	var later []string
	n, err := wrap(ctx, f, "MarkDoneKeys", func() (int, error) {
		n, l, err := f.Store.MarkDoneKeys(ctx, owner, ids, evs, registry)
		later = l
		return n, err
	})
	return n, later, err
}

func (f *faultyStore) DueKeys(ctx context.Context, after string, limit int) ([]string, error) {
	return wrap(ctx, f, "DueKeys", func() ([]string, error) { return f.Store.DueKeys(ctx, after, limit) })
}

func (f *faultyStore) DeliverInTx(ctx context.Context, owner string, at driver.TxTurn, eventID, sub string, fn func(tx driver.DBTx) error) (bool, error) {
	return wrap(ctx, f, "DeliverInTx", func() (bool, error) { return f.Store.DeliverInTx(ctx, owner, at, eventID, sub, fn) })
}

func (f *faultyStore) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	return wrap(ctx, f, "ReleaseOwner", func() (int, error) { return f.Store.ReleaseOwner(ctx, owner) })
}
