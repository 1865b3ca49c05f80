package outbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// completer is the completion writer: one goroutine that records delivered
// items as DONE in batches, so that the common case costs one write per
// batch. The Outbox starts it with the workers and stops it after them.
type completer struct {
	store     driver.Store
	dstore    driver.DeliveryStore
	owner     string
	batchSize int
	linger    time.Duration
	leases    *leaseKeeper // what this instance holds: letGo once the DONE is written
	log       *slog.Logger
	health    *health
	m         Metrics
	sig       *signals
	ostore    driver.OrderedStore // nil: the store orders nothing
	reg       *registrar          // learned again when a DONE is refused for a stale registry
	// deferred writes the Splits of items whose undelivered
	// subscriptions only deferred them (deferredOnly), a batch at a time:
	// the dispatcher's recordDeferrals.
	deferred func(its []*item)
	// refused takes back the events whose completing write the store
	// refused for a stale registry and could not be made anew (see
	// staleRefusal); dispatcherDone is closed once nothing reads it.
	refused        chan<- staleRefusal
	dispatcherDone <-chan struct{}
	storeCtx       func() (context.Context, context.CancelFunc)

	// pending: the ordered events handed over whose DONE is not yet
	// written, per key; a key is named to the sequencer after the last
	// of them (see keyCompletions).
	pending keyCompletions

	// sharedAt is when the sequencer last queued events of ordered keys
	// from the table (unix nanoseconds; 0: never): see lingerNow.
	sharedAt atomic.Int64

	in   chan *item
	done chan struct{} // closed when run has returned

	mu   sync.RWMutex  // held for reading by add, for writing by stop to close in
	quit chan struct{} // closed by stop first
}

// completerRoom is how many batches of delivered items wait for the
// completer while it writes one: the workers hand items over without
// waiting as long as there is room. A completion write can take a few
// hundred milliseconds under load (up to 390 ms, MariaDB, 64 producers
// committing 5,500 events/s): with room for 4 batches (2,000 items) the
// workers then waited on the completer, the handler calls behind them
// too, and the hot queue overflowed to the poller (commit→handler p99 85
// to 510 ms in 4 of 6 runs). With 16 (8,000 items, about 1.5 s at that
// rate) p99 stayed under 1.1 ms in 6 of 6. The items waiting are in the
// in-flight set, their leases renewed, as any other.
const completerRoom = 16

func newCompleter(d *deps, leases *leaseKeeper) *completer {
	return &completer{
		store: d.store, dstore: d.dstore, owner: d.cfg.InstanceID,
		batchSize: d.cfg.CompletionBatchSize, linger: d.cfg.CompletionLinger,
		leases: leases, log: d.log, health: d.health, m: d.m, storeCtx: d.storeCtx,
		in: make(chan *item, completerRoom*d.cfg.CompletionBatchSize), quit: make(chan struct{}),
	}
}

func (c *completer) start() {
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.run()
	}()
}

// add hands over a delivered item (or one only deferred, deferredOnly);
// the completer releases it from the in-flight set (leaseKeeper.letGo)
// once its DONE (or Split) is written. After stop (a worker Close stopped
// waiting for), the item is left as it is: its lease runs out and it is
// delivered again.
func (c *completer) add(it *item) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if recordsKey(it) {
		c.pending.add(it.env.OrderingKey)
	}
	select {
	case <-c.quit:
	default:
		select {
		case c.in <- it:
			return
		case <-c.quit:
		}
	}
	if recordsKey(it) {
		c.pending.done(it.env.OrderingKey, false, 0)
	}
	c.log.Warn("finished after Close stopped waiting: the event will be delivered again once its lease runs out", slog.String("event_id", it.env.ID))
}

// stop writes what is left and waits for the goroutine, or for until to
// end (see runner.stop); it reports whether the goroutine returned.
// Nothing may be added after.
func (c *completer) stop(until context.Context) bool {
	// No add may send on in once it is closed: quit releases those
	// waiting for room, the lock waits for them to be gone.
	close(c.quit)
	c.mu.Lock()
	close(c.in)
	c.mu.Unlock()
	if c.done == nil {
		return true
	}
	return waitUntil(c.done, until)
}

// run takes what the workers have finished, waiting up to the linger for
// more, up to the batch size, writes one statement (two if deliveries of
// split events are among them), and repeats until in is closed.
func (c *completer) run() {
	g := newGatherer(c.in, c.batchSize, c.linger)
	g.lingerNow = func() time.Duration { return c.lingerNow(time.Now()) }
	batch := make([]*item, 0, c.batchSize)
	ids := make([]string, 0, c.batchSize)
	var keys []driver.DeliveryID
	var done []driver.KeyDone
	var deferred []*item
	for {
		var ok bool
		if batch, ok = g.next(batch); !ok {
			return
		}
		ids, keys, done, deferred = ids[:0], keys[:0], done[:0], deferred[:0]
		batch = slices.DeleteFunc(batch, func(it *item) bool {
			if deferredOnly(it) {
				deferred = append(deferred, it)
				return true
			}
			return false
		})
		if len(deferred) > 0 {
			c.deferred(deferred)
		}
		for _, it := range batch {
			switch {
			case it.sub != nil:
				keys = append(keys, driver.DeliveryID{EventID: it.env.ID, Subscription: it.sub.Name})
			case recordsKey(it):
				// The keys of ordered events are recorded with their
				// DONE, in the same transaction, so that their next
				// events, often already on their way to a Publish, take
				// the hot path.
				done = append(done, driver.KeyDone{EventID: it.env.ID, Key: it.env.OrderingKey, Seq: it.env.seq})
				fallthrough
			default:
				ids = append(ids, it.env.ID)
			}
		}
		var later map[string]bool // nil: every key may have events waiting
		var refused map[*item]bool
		if len(ids) > 0 {
			later, refused = c.markDoneFenced(batch, ids, done)
		}
		if len(keys) > 0 {
			c.completeDeliveries(keys)
		}
		for _, it := range batch {
			c.written(it, refused[it], later)
		}
		c.giveBackRefused(refused)
	}
}

// written finishes it once its completion was written (or refused for a
// stale registry: it is given back after), and names its key to the
// sequencer when the key's next event may wait in the table. later are
// the keys the store said have later events (nil: any may).
func (c *completer) written(it *item, refused bool, later map[string]bool) {
	if refused {
		// Not written: given back by the caller, its key named now.
		if !recordsKey(it) {
			return
		}
		if past, ok := c.pending.done(it.env.OrderingKey, false, 0); ok {
			c.sig.namePast(it.env.OrderingKey, past)
		}
		return
	}
	c.leases.letGo(it.key())
	if !recordsKey(it) {
		c.sig.next(it) // the sequencer records it (its number unknown here)
		return
	}
	// Asked again: the next event may have come since. Recorded with the
	// DONE; a later event of the key waits in the table (or may): its
	// claim, once no other DONE of the key is still to be written here.
	// The sequencer skips the claim if this instance holds the key past
	// the event by then (keyTable.holdsAfter).
	k := it.env.OrderingKey
	name := !it.handedOn && (later == nil || later[k])
	if past, ok := c.pending.done(k, name, it.env.seq); ok {
		c.sig.namePast(k, past)
	}
}

// markDoneFenced is markDoneByRegistry, and for the events refused for
// a stale registry that owe the same subscriptions under the new one
// (recheck), the same write again with its version.
func (c *completer) markDoneFenced(batch []*item, ids []string, done []driver.KeyDone) (later map[string]bool, refused map[*item]bool) {
	later, refused = c.markDoneByRegistry(batch, ids, done)
	if len(refused) == 0 || c.refused == nil {
		return later, refused
	}
	its, v := refusedItems(refused)
	ctx, cancel := c.storeCtx()
	again := c.recheck(ctx, v, its)
	cancel()
	if len(again) == 0 {
		return later, refused
	}
	ids = make([]string, 0, len(again))
	var adone []driver.KeyDone
	for _, it := range again {
		ids = append(ids, it.env.ID)
		if j := slices.IndexFunc(done, func(k driver.KeyDone) bool { return k.EventID == it.env.ID }); j >= 0 {
			adone = append(adone, done[j])
		}
	}
	l, r := c.markDoneByRegistry(again, ids, adone)
	for _, it := range again {
		refused[it] = r[it]
	}
	if later != nil && l != nil {
		maps.Copy(later, l)
	} else if l == nil {
		later = nil
	}
	return later, refused
}

// refusedItems lists the items refused holds as refused, and the newest
// registry version among them.
func refusedItems(refused map[*item]bool) ([]*item, int64) {
	var its []*item
	v := int64(-1)
	for it, r := range refused {
		if r {
			its = append(its, it)
			v = max(v, it.registry)
		}
	}
	return its, v
}

// markDoneByRegistry writes ids, the whole events of batch, DONE with
// done (their ordered ones), one write per registry version the events'
// subscriptions were decided by (one, unless the registry was learned
// again while the batch gathered). It returns the keys whose later
// events may wait in the table (nil: any may), and the events whose
// write the store refused for a stale registry.
func (c *completer) markDoneByRegistry(batch []*item, ids []string, done []driver.KeyDone) (later map[string]bool, refused map[*item]bool) {
	v := int64(-1)
	mixed := false
	for _, it := range batch {
		if it.sub == nil {
			mixed = mixed || (v >= 0 && it.registry != v)
			v = max(v, it.registry)
		}
	}
	if !mixed {
		later, err := c.markDone(ids, done, v)
		if fenced(err) {
			refused = map[*item]bool{}
			for _, it := range batch {
				refused[it] = it.sub == nil
			}
		}
		return later, refused
	}
	// Rare: write each version's events apart.
	later = map[string]bool{}
	for _, group := range byRegistry(batch) {
		gids := make([]string, len(group))
		var gdone []driver.KeyDone
		for i, it := range group {
			gids[i] = it.env.ID
			if j := slices.IndexFunc(done, func(k driver.KeyDone) bool { return k.EventID == it.env.ID }); j >= 0 {
				gdone = append(gdone, done[j])
			}
		}
		l, err := c.markDone(gids, gdone, group[0].registry)
		switch {
		case fenced(err):
			if refused == nil {
				refused = map[*item]bool{}
			}
			for _, it := range group {
				refused[it] = true
			}
		case l == nil:
			later = nil
		case later != nil:
			maps.Copy(later, l)
		}
	}
	return later, refused
}

// byRegistry groups the whole events of batch by the registry version
// their subscriptions were decided by.
func byRegistry(batch []*item) [][]*item {
	var out [][]*item
	at := map[int64]int{}
	for _, it := range batch {
		if it.sub != nil {
			continue
		}
		i, ok := at[it.registry]
		if !ok {
			i = len(out)
			at[it.registry] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], it)
	}
	return out
}

// giveBackRefused hands the events whose DONE was refused for a stale
// registry to the dispatcher, which learns the registry again and gives
// them back to be delivered anew.
func (c *completer) giveBackRefused(refused map[*item]bool) {
	if len(refused) == 0 || c.refused == nil {
		return
	}
	its, v := refusedItems(refused)
	if len(its) == 0 {
		return
	}
	ctx, cancel := c.storeCtx()
	defer cancel()
	c.resplit(ctx, v, its)
}

// sharedKeysLinger is the completion writer's linger while ordering keys
// are shared with other instances (sharedKeysFor after the sequencer last
// queued events of ordered keys from the table), if
// Config.CompletionLinger is longer. An event of a key published on
// another instance while this one holds the key's event before it
// (delivered, its DONE not yet written) waits in the table until that
// DONE and the claim after it: each millisecond of linger is a
// millisecond more of that window, and of that wait. On two instances
// (BENCHMARKS.md, item 18) 2ms instead of 10ms took the events that
// waited so down by a quarter to a half and their p99 by 1.5–3×, at the
// same commit rate. With keys that keep to one instance nothing waits in
// the table (a claim of a key named after its DONE finds nothing: on
// MySQL the completion passes over key rows publishers hold and names
// those keys, in vain), and the linger is the configured one.
const (
	sharedKeysLinger = 2 * time.Millisecond
	sharedKeysFor    = 10 * time.Second
)

// lingerNow returns how long the next batch waits for more: the
// configured linger, or sharedKeysLinger while keys are shared.
func (c *completer) lingerNow(now time.Time) time.Duration {
	if c.linger <= sharedKeysLinger {
		return c.linger
	}
	if at := c.sharedAt.Load(); at != 0 && now.Sub(time.Unix(0, at)) < sharedKeysFor {
		return sharedKeysLinger
	}
	return c.linger
}

// recordsKey reports whether it, delivered, is recorded on its key with
// its DONE (MarkDoneKeys), which takes the key's record to its number:
// an ordered event with a known number, and nothing earlier of its key
// pending (a hot head, a claimed head nobody was behind, or one that
// waited here behind such an event). Another goes through the sequencer,
// whose KeysDone never takes a key past an earlier event still pending.
func recordsKey(it *item) bool {
	return it.sub == nil && it.env.ordered && it.env.seq > 0 && len(it.behind) == 0
}

func (c *completer) completeDeliveries(keys []driver.DeliveryID) {
	ctx, cancel := c.storeCtx()
	defer cancel()
	start := time.Now()
	n, err := retryStore(ctx, func() (int, error) { return c.dstore.CompleteDeliveries(ctx, c.owner, keys) })
	c.m.Statement("complete_deliveries", n, time.Since(start))
	if err != nil {
		c.health.completeFails.Add(1)
		c.log.Error("mark deliveries done; they will be delivered again", slog.Int("deliveries", len(keys)), slog.Any("error", err))
		return
	}
	c.health.completeFails.Store(0)
	if n < len(keys) {
		c.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("deliveries", len(keys)-n))
	}
}

// markDone writes ids DONE, and records done, the ordered events among
// them, on their keys, if the registry's version is still registry. It
// returns the keys of done whose later events may wait in the table, or
// nil if it cannot tell, and the write's error (logged here, but for a
// refusal for a stale registry, which the caller handles).
func (c *completer) markDone(ids []string, done []driver.KeyDone, registry int64) (map[string]bool, error) {
	ctx, cancel := c.storeCtx()
	defer cancel()
	start := time.Now()
	var later map[string]bool
	n, err := retryStore(ctx, func() (int, error) {
		if len(done) > 0 && c.ostore != nil {
			n, keys, err := c.ostore.MarkDoneKeys(ctx, c.owner, ids, done, registry)
			later = make(map[string]bool, len(keys))
			for _, k := range keys {
				later[k] = true
			}
			return n, err
		}
		return c.store.MarkDone(ctx, c.owner, ids, registry)
	})
	c.m.Statement("mark_done", n, time.Since(start))
	if fenced(err) {
		return nil, err // given back by the caller
	}
	if err != nil {
		// The rows keep their lease and are delivered again once it
		// expires: at least once, never lost.
		c.health.completeFails.Add(1)
		c.log.Error("mark events done; they will be delivered again", slog.Int("events", len(ids)), slog.Any("error", err))
		return nil, err
	}
	c.health.completeFails.Store(0)
	if n < len(ids) {
		c.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("events", len(ids)-n))
	}
	return later, nil
}

// keyCompletions counts, per ordering key, the events handed to the
// completer whose DONE is not yet written, and holds back the naming of a
// key to the sequencer until the last of them is written. Workers hand
// events over in the order they finish, not in their key's order: the
// last event of a run can reach the completer before the one before it
// (handed on to it, then added), and its DONE, written first, would name
// the key while that one's lease still holds the key (a claim then takes
// nothing, and the rest of the key's backlog waited for the poll).
type keyCompletions struct {
	mu      sync.Mutex
	pending map[string]int
	owed    map[string]int64 // a naming held back: the highest number that named it
}

func (k *keyCompletions) add(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.pending == nil {
		k.pending, k.owed = map[string]int{}, map[string]int64{}
	}
	k.pending[key]++
}

// done counts one event of key, numbered seq, as written, name saying
// whether its key is to be named; it reports whether to name the key now (it is,
// or was for an event written before, and no other event of the key is
// pending), and the highest number of those that named it (0 if one of
// them has none): whoever holds the key past that one names it again.
func (k *keyCompletions) done(key string, name bool, seq int64) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if past, ok := k.owed[key]; name {
		switch {
		case seq <= 0 || (ok && past <= 0):
			k.owed[key] = 0 // a number unknown: named whatever is held
		case !ok || seq > past:
			k.owed[key] = seq
		}
	}
	if k.pending[key]--; k.pending[key] > 0 {
		return 0, false
	}
	owed, ok := k.owed[key]
	delete(k.pending, key)
	delete(k.owed, key)
	return owed, ok
}
