package outbox

import (
	"cmp"
	"container/heap"
	"context"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// poller claims what is due (events the hot path missed, retries,
// deliveries of split events, what other instances left) and offers it to
// the dispatcher's cold queue. It also releases the leases of events
// dropped from a full hot queue.
type poller struct {
	*deps
	disp   *dispatcher
	reg    *registrar
	leases *leaseKeeper
	seq    *sequencer

	nudge    chan struct{}  // wakes the poller; capacity 1
	retryDue chan time.Time // due times of retries scheduled here
	// missed: a due time was lost to a full retryDue (capacity 1); the
	// poller then asks the store for the next (Scheduler.NextDue).
	missed  chan struct{}
	dropped chan string // ids dropped from a full hot queue, to release
	// overflowUntil: until then, claims ignore SkipRecent (set when
	// dropped events were released; owned by run's goroutine).
	overflowUntil time.Time
	// jitter returns a random duration in [0, d]; the tests of exact
	// timing replace it before Start.
	jitter func(d time.Duration) time.Duration
	runner
}

func newPoller(d *deps) *poller {
	return &poller{
		deps:     d,
		nudge:    make(chan struct{}, 1),
		retryDue: make(chan time.Time, 1024),
		missed:   make(chan struct{}, 1),
		dropped:  make(chan string, max(10*d.cfg.HotQueueSize, 10000)),
		jitter:   randomUpTo(d.cfg.InstanceID),
	}
}

// randomUpTo returns a jitter in [0, d] drawn from a source seeded by the
// instance's id: instances with different ids draw apart (what the jitter
// is for), and one instance draws the same sequence every time it runs
// with that id, so that a simulation replays its polls (the poller alone
// calls it).
func randomUpTo(instance string) func(time.Duration) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(instance))
	r := rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
	return func(d time.Duration) time.Duration {
		if d <= 0 {
			return 0
		}
		return time.Duration(r.Int64N(int64(d) + 1))
	}
}

// backoff returns the wait after an idle or failed poll that waited
// wait: twice that, within [PollInterval, PollMaxInterval], less up to a
// quarter at random. Without the jitter, instances that idle on the same
// cadence stay in step for good, and one of them can come first, every
// time, to a row that is handed back on that cadence: an instance with no
// subscription for an event's type (it hands the event back for
// NoListenerDelay) could keep it from the one that has, for as long as
// both run.
func (p *poller) backoff(wait time.Duration) time.Duration {
	w := min(max(p.cfg.PollInterval, 2*wait), p.cfg.PollMaxInterval)
	return w - p.jitter(w/4)
}

// retryWakeMargin is added to a retry's due time before the poller wakes
// for it, so that the database's clock has surely passed the row's
// available_at.
const retryWakeMargin = 2 * time.Millisecond

// maxRetryWakes bounds the due times the poller keeps (retries, delayed
// events): it keeps the earliest. Once it gave one up (or one was lost
// on its way), the poller asks the store for the next due time after
// every poll, until there is none (tableWake).
const maxRetryWakes = 10000

// tableWakeGap is the least time between two polls woken by the store's
// next due time (tableWake): when events fall due every millisecond, a
// poll takes those of tableWakeGap at once.
const tableWakeGap = 25 * time.Millisecond

// timeHeap is a min-heap of due times.
type timeHeap []time.Time

func (h timeHeap) Len() int           { return len(h) }
func (h timeHeap) Less(i, j int) bool { return h[i].Before(h[j]) }
func (h timeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timeHeap) Push(x any)        { *h = append(*h, x.(time.Time)) }
func (h *timeHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// Poll runs one poll cycle now: it claims due events, as many as fit the
// cold queue and the batch size, and queues them for the workers. It
// returns how many it queued. It is for tests and tools; the engine polls
// by itself after Start.
func (o *Outbox) Poll(ctx context.Context) (int, error) {
	o.mu.RLock()
	closed := o.closed
	o.mu.RUnlock()
	if closed {
		return 0, ErrClosed
	}
	o.poller.releaseDropped()
	n, _, err := o.poller.poll(ctx, o.cfg.PollBatchSize, o.cfg.SkipRecent)
	return n, err
}

func createdOr(r *driver.Row, now time.Time) time.Time {
	if r.CreatedAt.IsZero() {
		return now
	}
	return r.CreatedAt
}

type offerResult int8

const (
	offerQueued offerResult = iota
	offerInHand             // queued or running here already
	offerFull               // the cold queue is full
)

// run runs the poller until ctx is done: once at start (to pick up
// what a previous run left), then every PollInterval, doubling the wait up
// to PollMaxInterval while it finds nothing (less a random part: see
// backoff). A full batch is followed by another poll as soon as the cold
// queue has room; a hot-queue overflow wakes it early; and it wakes when a
// retry this instance scheduled falls due, so that retries follow
// Config.Retry instead of the poll interval.
func (p *poller) run(ctx context.Context) {
	wait := time.Duration(0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	wakes := newRetryWakes()
	defer wakes.timer.Stop()
	cut := false  // due times were given up or lost: ask the store (tableWake)
	more := false // the last poll was woken and got all it asked for
	for {
		woken := false // by a due time: a retry, or a delayed event (NotBefore)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-p.nudge:
			wait = 0
		case due := <-p.retryDue:
			if !wakes.add(due) && !cut {
				cut = p.tableWake(ctx, wakes)
			}
			continue
		case <-p.missed:
			cut = p.tableWake(ctx, wakes)
			continue
		case <-wakes.timer.C:
			wakes.fired(time.Now())
			woken = true
		}
		released, ok := p.waitForRoom(ctx)
		if !ok {
			return
		}
		// Events dropped from a full hot queue are claimed at once, not
		// after SkipRecent: nothing else is about to deliver them (the
		// window only spares claims of rows a hot path has in hand, and
		// leases keep the poller off those anyway). For SkipRecent after
		// a release, every claim here takes what is free, however young,
		// so that a burst the hot queue could not hold goes out through
		// the poller at its pace instead of a second later.
		if released > 0 {
			p.overflowUntil = time.Now().Add(p.cfg.SkipRecent)
		}
		// So is a delayed event when its due time wakes the poller: its
		// available_at, which SkipRecent counts from, is that time, just
		// passed.
		// As are the polls right after one woken that got all it asked
		// for: more fell due at that time than one claim takes.
		woken = woken || more
		skip := p.cfg.SkipRecent
		if woken || time.Now().Before(p.overflowUntil) {
			skip = -1
		}
		n, limit, err := p.poll(ctx, p.cfg.PollBatchSize, skip)
		more = woken && err == nil && n > 0 && n == limit
		if err == nil {
			p.health.pollBeat.Store(time.Now().UnixNano())
		} else if ctx.Err() != nil {
			return
		}
		wait = p.nextWait(wait, n, limit, released, err)
		timer.Reset(wait)
		if cut {
			cut = p.tableWake(ctx, wakes)
		}
	}
}

// tableWake sets a wake-up for the store's next due time (a delayed event
// this instance gave up or lost the due time of), at least tableWakeGap
// from now, and reports whether there was one (or the store could not
// say: it asks again after the next poll).
func (p *poller) tableWake(ctx context.Context, wakes *retryWakes) bool {
	sch, ok := p.store.(driver.Scheduler)
	if !ok {
		return false
	}
	ctx, cancel := p.storeCtx()
	defer cancel()
	wait, any, err := sch.NextDue(ctx)
	if err != nil {
		p.log.Warn("read when the next delayed event falls due; a regular poll takes it", slog.Any("error", err))
		return true
	}
	if any {
		wakes.add(time.Now().Add(max(wait, tableWakeGap)))
	}
	return any
}

// waitForRoom waits while the cold queue is (nearly) full, skipping
// cycles until a worker makes room, checking again every PollInterval;
// events dropped from the hot queue meanwhile are still released, so that
// other instances can take them. It returns how many it released, and
// false if ctx ended.
func (p *poller) waitForRoom(ctx context.Context) (released int, ok bool) {
	for cap(p.disp.cold)-len(p.disp.cold) < min(p.cfg.PollBatchSize, cap(p.disp.cold))/2+1 {
		p.health.pollBeat.Store(time.Now().UnixNano()) // waiting for room is alive
		released += p.releaseDropped()
		roomy := time.NewTimer(p.cfg.PollInterval)
		select {
		case <-ctx.Done():
			roomy.Stop()
			return released, false
		case <-p.disp.coldSpace:
		case <-roomy.C:
		}
		roomy.Stop()
	}
	return released + p.releaseDropped(), true
}

// nextWait returns how long to wait before the next poll, after one that
// queued n of at most limit events (or failed with err), with released
// events dropped from the hot queue just released.
func (p *poller) nextWait(wait time.Duration, n, limit, released int, err error) time.Duration {
	switch {
	case err != nil:
		p.log.Error("poll for due events", slog.Any("error", err))
		return p.backoff(wait)
	case n > 0 && n == limit:
		return 0 // more is probably due
	case n > 0:
		return p.cfg.PollInterval
	case released > 0:
		// Overflowed events were just released but are younger than
		// SkipRecent: come back for them as soon as they are due.
		return min(max(p.cfg.SkipRecent, time.Millisecond), p.cfg.PollInterval)
	default:
		return p.backoff(wait)
	}
}

// retryWakes are the due times of retries scheduled here (at most
// maxRetryWakes), each rounded up to a multiple of wakeGrain and kept
// once, and a timer that fires at the earliest.
type retryWakes struct {
	dues  timeHeap
	kept  map[int64]bool // the dues, in Unix nanoseconds
	timer *time.Timer
}

func newRetryWakes() *retryWakes {
	w := &retryWakes{kept: map[int64]bool{}, timer: time.NewTimer(time.Hour)}
	w.timer.Stop()
	return w
}

// wakeGrain is what the poller's wake-ups for due times are rounded up
// to. Retries and deferrals decided one after another fall due
// microseconds apart, and a wake-up each kept the poller polling back to
// back, each poll finding the one or two just due (about 400 polls a
// second, two statements each, after a drain beside a rate limit); a
// poll at the end of a grain takes all that fell due within it.
const wakeGrain = 25 * time.Millisecond

// add keeps due, rounded up to a multiple of wakeGrain, and reports
// false if it gave up a due time for it (or due itself) because it keeps
// maxRetryWakes already.
func (w *retryWakes) add(due time.Time) bool {
	if at := due.Truncate(wakeGrain); at.Before(due) {
		due = at.Add(wakeGrain)
	} else {
		due = at
	}
	if w.kept[due.UnixNano()] {
		return true // a poll already comes then
	}
	kept := true
	if len(w.dues) >= maxRetryWakes {
		// Full: keep the earliest, giving up the latest if due is
		// before it (a leaf of the min-heap; scanned only when full).
		kept = false
		last := len(w.dues) / 2
		for i := last + 1; i < len(w.dues); i++ {
			if w.dues[i].After(w.dues[last]) {
				last = i
			}
		}
		if !due.Before(w.dues[last]) {
			return false
		}
		delete(w.kept, w.dues[last].UnixNano())
		w.dues[last] = due
		heap.Fix(&w.dues, last)
	} else {
		heap.Push(&w.dues, due)
	}
	w.kept[due.UnixNano()] = true
	if w.dues[0].Equal(due) {
		w.timer.Reset(time.Until(due) + retryWakeMargin)
	}
	return kept
}

// fired drops the due times passed by now and sets the timer for the
// next.
func (w *retryWakes) fired(now time.Time) {
	for len(w.dues) > 0 && !w.dues[0].After(now) {
		delete(w.kept, heap.Pop(&w.dues).(time.Time).UnixNano())
	}
	if len(w.dues) > 0 {
		w.timer.Reset(time.Until(w.dues[0]) + retryWakeMargin)
	}
}

// scheduleRetryWake asks the poller to poll when a retry falls due. It
// never blocks: if the poller is behind, the retry waits for a regular
// poll.
func (p *poller) scheduleRetryWake(due time.Time) {
	select {
	case p.retryDue <- due:
	default:
		select {
		case p.missed <- struct{}{}:
		default:
		}
	}
}

func (p *poller) poll(ctx context.Context, most int, skipRecent time.Duration) (queued, limit int, err error) {
	limit = min(most, cap(p.disp.cold)-len(p.disp.cold))
	if limit <= 0 {
		return 0, 0, nil
	}
	if len(p.reg.load().local) == 0 {
		// An instance with no subscription (one that only publishes)
		// leaves the claims to those that deliver: it could only hand
		// what it claimed back, for NoListenerDelay, and so delay it.
		return 0, limit, nil
	}
	// A claim that has started runs to its end even if Close cancels ctx
	// (until the engine's life ends, a grace period after Close's own):
	// a COMMIT cancelled on the way may still have succeeded on the
	// server, and rows leased to this instance but in none of its queues
	// would wait out a whole lease. What it took goes to the cold queue,
	// which Close drains or hands back; and whatever is still leased here
	// once every part has stopped, Close releases last (releaseHeld).
	ctx, cancel := p.storeCtx()
	defer cancel()
	reg := p.reg.load()
	var t pollTally
	defer t.finish(ctx, p)
	// Gates at least half empty first: while a backlog drains, the claims
	// of whole events fill the limit, and would leave what a limited
	// subscription has waiting in the table behind them.
	p.refillGates(ctx, reg, limit, &t)
	if t.taken < limit {
		only, not := reg.claimTypes()
		claimStart := time.Now()
		rows, err := p.store.Claim(ctx, driver.ClaimRequest{
			Owner:      p.cfg.InstanceID,
			Limit:      limit - t.taken,
			Lease:      p.cfg.Lease,
			SkipRecent: skipRecent,
			Types:      only,
			NotTypes:   not,
		})
		p.m.Statement("claim", len(rows), time.Since(claimStart))
		if err != nil {
			return t.queued, limit, err
		}
		t.rows(ctx, p, reg, rows, claimStart)
	}
	if t.taken < limit {
		t.deliveries(p, reg, p.pollDeliveries(ctx, reg, limit-t.taken), time.Now())
	}
	// The heads of ordering keys with events due.
	if n, err := p.seq.sweep(ctx, limit-t.queued); err != nil {
		p.log.Error("claim the events of ordering keys", slog.Any("error", err))
	} else {
		t.queued += n
	}
	return t.queued, limit, nil
}

// pollTally is what one poll claimed: it counts what was taken and
// queued, and keeps what could not be queued for finish to give back.
type pollTally struct {
	refill                   bool // queue what is claimed now through offerRefill
	taken, queued, reclaimed int
	unqueued, unhandled      []string
	unqueuedDeliveries       []driver.DeliveryID
}

// rows queues rows, whole events claimed at claimStart.
func (t *pollTally) rows(ctx context.Context, p *poller, reg *registry, rows []driver.Row, claimStart time.Time) {
	t.taken += len(rows)
	for i := range rows {
		if r := &rows[i]; r.PrevOwner != "" && r.PrevOwner != p.cfg.InstanceID {
			t.reclaimed++
		}
	}
	queued, unqueued, unhandled := p.disp.offerRowsTo(ctx, reg, rows, nil, time.Now(), claimStart, t.offer(p))
	t.queued += queued
	t.unqueued = append(t.unqueued, unqueued...)
	t.unhandled = append(t.unhandled, unhandled...)
}

// deliveries queues ds, deliveries claimed at start.
func (t *pollTally) deliveries(p *poller, reg *registry, ds []driver.Delivery, start time.Time) {
	t.taken += len(ds)
	queued, unqueued, reclaimed := p.queueDeliveries(reg, ds, start, t.offer(p))
	t.queued += queued
	t.reclaimed += reclaimed
	t.unqueuedDeliveries = append(t.unqueuedDeliveries, unqueued...)
}

func (t *pollTally) offer(p *poller) func(*item) offerResult {
	if t.refill {
		return p.disp.offerRefill
	}
	return p.disp.offerCold
}

// finish gives back what was claimed and not queued, and counts the
// rest.
func (t *pollTally) finish(ctx context.Context, p *poller) {
	p.leases.releaseDeliveries(ctx, t.unqueuedDeliveries, 0, "release unqueued deliveries")
	p.leases.releaseLeases(ctx, t.unqueued, "release unqueued events")
	p.leases.release(ctx, t.unhandled, p.cfg.NoListenerDelay, "hand back events with no listener here")
	if t.queued > 0 {
		p.m.ColdEnqueued(t.queued)
	}
	if t.reclaimed > 0 {
		p.m.LeasesReclaimed(t.reclaimed)
		p.log.Info("took over events whose lease had expired", slog.Int("events", t.reclaimed))
	}
}

// pollDeliveries claims up to room deliveries of split events, for this
// instance's subscriptions that are neither paused nor waiting for their
// circuit, but those with a Rate (refillGates).
func (p *poller) pollDeliveries(ctx context.Context, reg *registry, room int) []driver.Delivery {
	// Subscriptions with a closed circuit in one claim; one whose circuit
	// waits for a probe gets one delivery, the probe, instead of a batch
	// it would only defer again.
	closed, probing := reg.claimable()
	closed, _ = reg.gated(closed)
	probing, _ = reg.gated(probing)
	ds := p.claimDeliveries(ctx, reg, room, closed)
	for _, name := range probing {
		ds = append(ds, p.claimDeliveries(ctx, reg, min(1, room-len(ds)), []string{name})...)
	}
	return ds
}

// claimDeliveries claims up to limit due deliveries of the subscriptions
// named, and the runs behind them (driver.ClaimRequest.Run).
func (p *poller) claimDeliveries(ctx context.Context, reg *registry, limit int, names []string) []driver.Delivery {
	if limit <= 0 || len(names) == 0 {
		return nil
	}
	start := time.Now()
	got, err := p.dstore.ClaimDeliveries(ctx, driver.ClaimRequest{
		Owner:      p.cfg.InstanceID,
		Limit:      limit,
		Lease:      p.cfg.Lease,
		SkipRecent: -1,
		Run:        p.cfg.ColdQueueSize,
	}, names, reg.orderFilter())
	p.m.Statement("claim_deliveries", len(got), time.Since(start))
	if err != nil {
		p.log.Error("claim deliveries", slog.Any("error", err))
	}
	return got
}

// queueDeliveries queues ds, deliveries claimed at start. It returns how
// many it queued, those it could not queue (to be released), and how
// many it took over from another instance whose lease had run out.
func (p *poller) queueDeliveries(reg *registry, ds []driver.Delivery, start time.Time, offerTo func(*item) offerResult) (queued int, unqueued []driver.DeliveryID, reclaimed int) {
	follows := deliveryRuns(ds, reg)
	for i := range ds {
		d := &ds[i]
		key := driver.DeliveryID{EventID: d.ID, Subscription: d.Subscription}
		if d.PrevOwner != "" && d.PrevOwner != p.cfg.InstanceID {
			reclaimed++
		}
		s := reg.byName[d.Subscription]
		env, err := decode(&d.Row)
		if err != nil || s == nil {
			// An event that cannot be read was buried when it was claimed
			// as a whole; a delivery of it would be too.
			unqueued = append(unqueued, key)
			continue
		}
		it := &item{env: env, path: PathCold, attempts: d.Attempts, since: createdOr(&d.Row, start), sub: s, leased: start}
		offer := offerTo
		if follows[i] && chained(it) {
			offer = p.disp.offerFollower
		}
		switch offer(it) {
		case offerQueued:
			queued++
		case offerFull:
			unqueued = append(unqueued, key)
		}
	}
	return queued, unqueued, reclaimed
}

// deliveryRuns sorts ds, claimed deliveries, so that those of one key to
// one ordered subscription (a head and the run behind it,
// driver.ClaimRequest.Run) come together in number order, and reports
// which follow the delivery before them.
func deliveryRuns(ds []driver.Delivery, reg *registry) []bool {
	ordered := func(d *driver.Delivery) bool {
		s := reg.byName[d.Subscription]
		return d.KeySeq > 0 && s != nil && s.Order != Unordered
	}
	slices.SortStableFunc(ds, func(a, b driver.Delivery) int {
		return cmp.Or(strings.Compare(a.Subscription, b.Subscription), byKeyNumber(a.Row, b.Row))
	})
	follows := make([]bool, len(ds))
	for i := 1; i < len(ds); i++ {
		follows[i] = ordered(&ds[i]) && ds[i].Subscription == ds[i-1].Subscription && ds[i].OrderingKey == ds[i-1].OrderingKey
	}
	return follows
}

// releaseDropped releases the leases of events dropped from the full hot
// queue, so that the claim that follows (here or on another instance) can
// take them. It takes every id waiting, so that none is still listed when
// its lease has run out and this instance's own claim may have taken the
// event; an event being delivered here is never released.
func (p *poller) releaseDropped() int {
	var ids []string
	for {
		select {
		case id := <-p.dropped:
			if !p.leases.holds(id) {
				ids = append(ids, id)
			}
			continue
		default:
		}
		break
	}
	if len(ids) == 0 {
		return 0
	}
	// Taken off the list, they must be released even if the caller's
	// context ends meanwhile (Close's, the poll loop's): else they stay
	// leased here until the lease runs out. Only the engine's life, a
	// grace period after Close's context, cuts the release short.
	ctx, cancel := p.storeCtx()
	defer cancel()
	p.leases.releaseLeases(ctx, ids, "release events dropped from the hot queue")
	return len(ids)
}

func (p *poller) wake() {
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}
