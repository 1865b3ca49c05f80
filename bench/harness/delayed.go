package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
)

// The delayed-events row (issue 35, item 1): N events published with
// Envelope.NotBefore spread uniformly over a window W that starts Lead
// after the publishing starts, delivered by one engine (default Config,
// sqlstore) to a plain Handler that records when it received each.
// Lateness is receive time − NotBefore, both on this machine's clock.

// Targets of the delayed-events row: the p99 lateness, and the live heap
// (after a GC) at most this much above its level before the publishing,
// once every event is scheduled and again once every event is delivered:
// no per-event memory for a scheduled event (8 MiB is 8 bytes an event
// at 1M).
const (
	DelayedLateP99    = time.Second
	DelayedHeapGrowth = 8 << 20
)

// DelayedPublishRate is the publish rate the automatic Lead assumes
// (events/s; each delayed event is an INSERT in a batch plus an UPDATE of
// its own): the publishing of N events should end before the first is
// due.
const DelayedPublishRate = 4000

// DelayedOptions configure RunDelayed.
type DelayedOptions struct {
	// N is the events published. Defaults to 1,000,000.
	N int64
	// Window is the span of their NotBefore times. Defaults to 10 min.
	Window time.Duration
	// Lead is the time from the start of the publishing to the first
	// NotBefore. 0: 10 s + N at DelayedPublishRate.
	Lead time.Duration
	// Producers publish concurrently. Defaults to 8.
	Producers int
	// PerTx is the events of each producer transaction (one PublishAll).
	// Defaults to 100.
	PerTx int
	// Prefix names the tables.
	Prefix string
	// Log receives progress lines; nil: none.
	Log func(format string, args ...any)
}

func (o *DelayedOptions) defaults() {
	o.N = cmpOr(o.N, 1_000_000)
	o.Window = cmpOr(o.Window, 10*time.Minute)
	o.Lead = cmpOr(o.Lead, DelayedLead(o.N))
	o.Producers = cmpOr(o.Producers, 8)
	o.PerTx = cmpOr(o.PerTx, 100)
	if o.Prefix == "" {
		o.Prefix = UniquePrefix("dly")
	}
}

// DelayedLead is the automatic lead for n events.
func DelayedLead(n int64) time.Duration {
	return 10*time.Second + time.Duration(float64(n)/DelayedPublishRate*float64(time.Second)).Round(time.Second)
}

// DelayedResult is one run of RunDelayed.
type DelayedResult struct {
	DB               string
	N                int64
	Window, Lead     time.Duration
	Producers, PerTx int
	// Publish is from the first BEGIN to the last COMMIT; PublishErrors
	// the transactions that failed (and were retried).
	Publish       time.Duration
	PublishErrors int64
	Published     int64
	// Delivered is the distinct events received, Duplicates the handler
	// calls beyond the first of an event, Lost the published events never
	// received, Early those received before their NotBefore.
	Delivered, Duplicates, Lost, Early int64
	// Lateness of the first delivery of each event, receive − NotBefore.
	LateP50, LateP99, LateMax time.Duration
	// LateP99ByTenth is the lateness p99 of the events due in each tenth
	// of the window, in order.
	LateP99ByTenth []time.Duration
	// Span is from the first NotBefore to the last first delivery; Rate
	// is Delivered ÷ Span.
	Span time.Duration
	Rate float64
	// FirstDue is the first NotBefore on the time axis of Mem.
	FirstDue time.Duration
	// Hot and Cold are the events queued by the hot path and by the
	// poller; Claims the claims the engine ran.
	Hot, Cold, Claims int64
	// LiveBefore, LivePublished and LiveEnd are the live heap (HeapAlloc
	// right after runtime.GC): before the publishing, once it ended, and
	// once the last event was delivered.
	LiveBefore, LivePublished, LiveEnd uint64
	// Mem are HeapInuse/HeapAlloc samples every second, from before the
	// publishing to the last delivery.
	Mem  []MemSample `json:",omitempty"`
	Load string
}

// PublishedInTime reports whether the publishing ended before the first
// event was due.
func (r DelayedResult) PublishedInTime() bool { return r.Publish < r.Lead }

// LatenessMet reports whether every event was published and delivered,
// at a p99 lateness within DelayedLateP99.
func (r DelayedResult) LatenessMet() bool {
	return r.Published == r.N && r.Lost == 0 && r.LateP99 <= DelayedLateP99
}

// HeapFlat reports whether the live heap stayed within DelayedHeapGrowth
// of its level before the publishing.
func (r DelayedResult) HeapFlat() bool {
	top := max(r.LivePublished, r.LiveEnd)
	return top <= r.LiveBefore || top-r.LiveBefore <= DelayedHeapGrowth
}

// WindowHeap returns the sampled HeapInuse at the first NotBefore, its
// maximum from then on, and the last sample.
func (r DelayedResult) WindowHeap() (start, peak, end uint64) {
	for _, s := range r.Mem {
		if s.At < r.FirstDue {
			continue
		}
		if start == 0 {
			start = s.HeapInuse
		}
		peak = max(peak, s.HeapInuse)
		end = s.HeapInuse
	}
	return start, peak, end
}

// delayedRun is the state of one RunDelayed.
type delayedRun struct {
	o     DelayedOptions
	db    *sqlx.DB
	ob    *outbox.Outbox
	rec   *Recorder
	first time.Duration // the first NotBefore, since rec's base
	next  atomic.Int64
	errs  atomic.Int64
	pub   atomic.Int64
}

// due returns event seq's NotBefore, since rec's base.
func (r *delayedRun) due(seq int64) time.Duration {
	return r.first + time.Duration(float64(r.o.Window)*float64(seq)/float64(r.o.N))
}

// RunDelayed publishes o.N delayed events on db (of dialect d) through
// one engine that delivers them, waits for them, and measures how late
// each arrived and how the heap behaved.
func RunDelayed(ctx context.Context, d *Dialect, db *sqlx.DB, o DelayedOptions) (res DelayedResult, err error) {
	o.defaults()
	res = DelayedResult{DB: d.Name, N: o.N, Window: o.Window, Lead: o.Lead, Producers: o.Producers, PerTx: o.PerTx}
	db.SetMaxOpenConns(o.Producers + 8)
	db.SetMaxIdleConns(o.Producers + 8)
	st, err := newStore(ctx, db, o.Prefix+"_ob")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, dropTables(ctx, db, storeTables(st)...)) }()
	var m Counters
	ob, err := outbox.New(&countingStore{Store: st, m: &m}, outbox.Config{Logger: quietLogger(), Metrics: &m})
	if err != nil {
		return res, err
	}
	run := &delayedRun{o: o, db: db, ob: ob, rec: NewRecorder(int(o.N))}
	ob.Handle("bench", func(_ context.Context, ev outbox.Event) error {
		run.rec.Delivered(seqOf(ev.AggregateID))
		return nil
	}, OrderPlaced)
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	res.LiveBefore = liveHeap()
	stopSampling := sampleEvery(time.Second, run.rec, &res.Mem)
	if err := run.publish(ctx, &res); err != nil {
		stopSampling()
		return res, errors.Join(err, ob.Close(context.WithoutCancel(ctx)))
	}
	timeout := run.first + o.Window + time.Minute - run.rec.Since()
	waitDelivered(ctx, run.rec, res.Published, timeout, 0)
	stopSampling()
	res.LiveEnd = liveHeap()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	err = ob.Close(cctx)
	cancel()
	run.finish(&res)
	res.Hot, _, res.Cold = m.Paths()
	_, _, res.Claims = m.Statements()
	res.Load = loadAverage()
	return res, err
}

// publish runs the producers until every event is published.
func (r *delayedRun) publish(ctx context.Context, res *DelayedResult) error {
	start := r.rec.Since()
	r.first = start + r.o.Lead
	logf(r.o.Log, "%s: publishing %d events, %d producers, %d a transaction; due from %v to %v from now",
		res.DB, r.o.N, r.o.Producers, r.o.PerTx, r.o.Lead, r.o.Lead+r.o.Window)
	var wg sync.WaitGroup
	for range r.o.Producers {
		wg.Go(func() { r.produce(ctx) })
	}
	wg.Wait()
	res.Publish, res.FirstDue = r.rec.Since()-start, r.first
	res.Published, res.PublishErrors = r.pub.Load(), r.errs.Load()
	res.LivePublished = liveHeap()
	logf(r.o.Log, "%s: published %d events in %v (%.0f events/s, %d failed transactions retried); first due in %v",
		res.DB, res.Published, res.Publish.Round(time.Millisecond), float64(res.Published)/res.Publish.Seconds(), res.PublishErrors,
		(r.first - r.rec.Since()).Round(time.Millisecond))
	return ctx.Err()
}

// produce publishes chunks of PerTx consecutive events, in the order of
// their NotBefore, until none is left or the window has ended (a database
// that slow publishes fewer than N; the row shows it); a failed
// transaction is retried (up to 10 times).
func (r *delayedRun) produce(ctx context.Context) {
	envs := make([]outbox.Envelope, 0, r.o.PerTx)
	for ctx.Err() == nil && r.rec.Since() < r.first+r.o.Window {
		lo := r.next.Add(int64(r.o.PerTx)) - int64(r.o.PerTx)
		if lo >= r.o.N {
			return
		}
		envs = envs[:0]
		for seq := lo; seq < min(lo+int64(r.o.PerTx), r.o.N); seq++ {
			envs = append(envs, outbox.Envelope{Type: OrderPlaced, AggregateType: "order", AggregateID: strconv.FormatInt(seq, 10),
				JSON: Payload(seq), NotBefore: r.rec.base.Add(r.due(seq))})
		}
		for try := 0; try < 10 && ctx.Err() == nil; try++ {
			if err := r.publishTx(ctx, envs); err == nil {
				r.pub.Add(int64(len(envs)))
				break
			}
			r.errs.Add(1)
		}
	}
}

func (r *delayedRun) publishTx(ctx context.Context, envs []outbox.Envelope) error {
	tx, err := outbox.BeginTx(ctx, r.db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := r.ob.PublishAllTx(ctx, tx, envs...); err != nil {
		return err
	}
	return tx.Commit()
}

// finish computes the lateness and the counts from the recorder.
func (r *delayedRun) finish(res *DelayedResult) {
	late := make([]time.Duration, 0, r.o.N)
	var cuts []int // late[cuts[i]:cuts[i+1]] are the events due in tenth i
	var last time.Duration
	for seq := range r.o.N {
		for len(cuts) <= int(seq*10/r.o.N) {
			cuts = append(cuts, len(late))
		}
		at := time.Duration(r.rec.deliver[seq].Load())
		if at == 0 {
			continue
		}
		l := at - r.due(seq)
		if l < 0 {
			res.Early++
		}
		late = append(late, l)
		last = max(last, at)
	}
	res.LateP99ByTenth = tenthsP99(late, append(cuts, len(late)))
	slices.Sort(late)
	res.Delivered, res.Duplicates = int64(len(late)), r.rec.dups.Load()
	res.Lost = res.Published - res.Delivered
	if len(late) > 0 {
		res.LateP50, res.LateP99, res.LateMax = quantile(late, 0.50), quantile(late, 0.99), late[len(late)-1]
	}
	if res.Span = last - r.first; res.Span > 0 {
		res.Rate = float64(res.Delivered) / res.Span.Seconds()
	}
}

// tenthsP99 returns the p99 of each part late[cuts[i]:cuts[i+1]].
func tenthsP99(late []time.Duration, cuts []int) []time.Duration {
	var out []time.Duration
	for i := 0; i+1 < len(cuts); i++ {
		part := slices.Clone(late[cuts[i]:cuts[i+1]])
		slices.Sort(part)
		out = append(out, quantile(part, 0.99))
	}
	return out
}

// tenthsString renders the p99 of each tenth, in seconds.
func tenthsString(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
	}
	return strings.Join(parts, ", ")
}

// liveHeap returns the heap in use by reachable objects: HeapAlloc right
// after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// String is the run in one line, for logs.
func (r DelayedResult) String() string {
	start, peak, end := r.WindowHeap()
	return fmt.Sprintf("%s delayed %d over %v (lead %v): published in %v, delivered %d (lost %d, dups %d, early %d), lateness p50 %v p99 %v max %v (p99 by tenth of the window, s: %s), %.0f events/s over %v; paths hot %d poller %d, %d claims; live heap %s → %s → %s, heap in use at window start %s, max %s, end %s; load %s",
		r.DB, r.N, r.Window, r.Lead, r.Publish.Round(time.Millisecond), r.Delivered, r.Lost, r.Duplicates, r.Early,
		r.LateP50.Round(time.Millisecond), r.LateP99.Round(time.Millisecond), r.LateMax.Round(time.Millisecond), tenthsString(r.LateP99ByTenth), r.Rate, r.Span.Round(time.Millisecond),
		r.Hot, r.Cold, r.Claims, mib(float64(r.LiveBefore)), mib(float64(r.LivePublished)), mib(float64(r.LiveEnd)),
		mib(float64(start)), mib(float64(peak)), mib(float64(end)), r.Load)
}

// DelayedTargets are the delayed-events row's targets, per database.
func DelayedTargets(rs []DelayedResult) []Target {
	var ts []Target
	for _, r := range rs {
		what := fmt.Sprintf("%s: %s delayed events over %v, lateness p99 (receive − NotBefore)", r.DB, num(float64(r.N)), r.Window)
		ts = append(ts, target(what, "≤ "+dur(float64(DelayedLateP99)), dur(float64(r.LateP99)), r.LatenessMet()))
		what = fmt.Sprintf("%s: %s delayed events over %v, live heap above its level before publishing", r.DB, num(float64(r.N)), r.Window)
		ts = append(ts, target(what, "≤ "+mib(DelayedHeapGrowth), heapGrowth(r), r.HeapFlat()))
	}
	return ts
}

func heapGrowth(r DelayedResult) string {
	return fmt.Sprintf("%s → %s (all scheduled) → %s (all delivered)", mib(float64(r.LiveBefore)), mib(float64(r.LivePublished)), mib(float64(r.LiveEnd)))
}

// WriteDelayed writes the section "Delayed events" of a report; header,
// if set, follows its title.
func WriteDelayed(w io.Writer, rs []DelayedResult, header string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Delayed events")
	p("")
	if header != "" {
		p("%s", header)
		p("")
	}
	if len(rs) > 0 {
		r := rs[0]
		p("%s events with `Envelope.NotBefore` spread evenly over %v, the first due %v after the publishing starts; %d producers in the bench process publish them in order of their due time, %d to a transaction (`PublishAllTx`), as fast as the database takes them, through the one engine (default Config, sqlstore) that delivers them to a plain `Handler` recording when it received each. **Lateness** = receive time − NotBefore, both on this machine's clock (the database only turns the delay into `available_at`); **early** = received before NotBefore (must be 0). **Delivered/s** = events delivered ÷ (last delivery − first NotBefore); the even spread is N ÷ window. **Live heap**: `HeapAlloc` right after `runtime.GC()`, before the publishing, once every event is scheduled, and once every event is delivered; it includes the harness's own record of 20 bytes an event, allocated before the first measure. **Heap in use**: `HeapInuse` sampled every second, at the first NotBefore, its maximum from then on, and at the end (garbage included). Paths: events queued by the hot path and by the poller (a delayed event never takes the hot path). Publishing stops at the end of the window: **published** below the events means the database could not take them in time. Targets: lateness p99 ≤ %v with every event published and delivered; the live heap no more than %s above its level before the publishing (no memory per scheduled event).",
			num(float64(r.N)), r.Window, r.Lead, r.Producers, r.PerTx, DelayedLateP99, mib(DelayedHeapGrowth))
		p("")
	}
	p("| database | events | window | publish (events/s) | before first due | published | delivered | lost | dups | early | lateness p50 | p99 | max | p99 by tenth of the window (s) | delivered/s (even spread) | paths hot / poller, claims | live heap | heap in use start / max / end | p99 ≤ %v | heap flat |", DelayedLateP99)
	p("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		start, peak, end := r.WindowHeap()
		inTime := "yes"
		if !r.PublishedInTime() {
			inTime = fmt.Sprintf("**no** (%v after)", (r.Publish - r.Lead).Round(time.Second))
		}
		p("| %s | %s | %v | %s (%s) | %s | %s | %s | %d | %d | %d | %s | %s | %s | %s | %s (%s) | %d / %d, %d | %s | %s / %s / %s | %s | %s |",
			r.DB, num(float64(r.N)), r.Window, dur(float64(r.Publish)), num(float64(r.Published)/r.Publish.Seconds()), inTime,
			num(float64(r.Published)), num(float64(r.Delivered)), r.Lost, r.Duplicates, r.Early, dur(float64(r.LateP50)), dur(float64(r.LateP99)), dur(float64(r.LateMax)), tenthsString(r.LateP99ByTenth),
			num(r.Rate), num(float64(r.N)/r.Window.Seconds()), r.Hot, r.Cold, r.Claims, heapGrowth(r),
			mib(float64(start)), mib(float64(peak)), mib(float64(end)), metMark(r.LatenessMet()), metMark(r.HeapFlat()))
	}
}

func metMark(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}
