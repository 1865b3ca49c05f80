package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
)

// The rate-limit rows (issue 35, item 4): a subscription limited to
// RateLimit events/s with a backlog of its events present, and an
// unlimited subscription draining a backlog beside it.

// Targets of the rate-limit rows.
const (
	RateLimit     = 500  // events/s of the limited subscription
	RateTolerance = 0.05 // its measured rate is within ±5 % of RateLimit
	RateBeside    = 0.9  // the drain beside it ÷ the same drain alone, at least
)

// Partner is the event type of the limited subscription's backlog.
const Partner outbox.EventType = "PartnerNotified"

// RateOptions tune the rate-limit rows.
type RateOptions struct {
	// Drain is the backlog of the unlimited subscription. Defaults to
	// 50,000.
	Drain int64
	// Window is how long the limited subscription's rate is measured,
	// after a second of warm-up; its backlog lasts longer. Defaults to
	// 20 s.
	Window time.Duration
	Log    func(format string, args ...any)
}

// Kinds of rate-limit run.
const (
	RateAlone      = "drain alone"                                          // the unlimited drain, no other subscription
	RateOther      = "drain beside a limit on other events"                 // + a limited subscription of another type's backlog
	RateOtherFree  = "drain beside the same, unlimited, on other events"    // RateOther's baseline: that subscription without its Rate
	RateShared     = "drain beside a limit on the same events"              // the limited subscription takes the drained events too
	RateSharedFree = "drain beside the same, unlimited, on the same events" // RateShared's baseline
)

// rateKinds are the kinds of run, in the order of the first repeat.
var rateKinds = []string{RateAlone, RateOther, RateOtherFree, RateShared, RateSharedFree}

// rateOrder returns the kinds of run of repeat r: each run beside a
// limit next to its baseline, so that the two see the same machine,
// the baseline first in every other repeat (a run after a pause is
// slower), and the three groups in an order that turns with the repeat.
func rateOrder(r int) []string {
	groups := [][]string{{RateAlone}, {RateOther, RateOtherFree}, {RateShared, RateSharedFree}}
	var out []string
	for i := range groups {
		g := slices.Clone(groups[(i+r)%len(groups)])
		if r%2 == 1 {
			slices.Reverse(g)
		}
		out = append(out, g...)
	}
	return out
}

// limitedKind reports whether kind has a limited subscription, and
// baseOf returns the kind it is compared with.
func limitedKind(kind string) bool { return kind == RateOther || kind == RateShared }

func baseOf(kind string) string {
	if kind == RateOther {
		return RateOtherFree
	}
	return RateSharedFree
}

// RateResult is one run of the rate-limit rows.
type RateResult struct {
	DB     string
	Repeat int
	Kind   string
	// Drain is the unlimited subscription's drain.
	Drain DrainResult
	// Limited is the limited subscription's rate over the window (0 in
	// the RateAlone run), Deferred how often it deferred an event.
	Limited  float64
	Deferred int64
}

// rateCounter records the limited subscription's deliveries.
type rateCounter struct {
	mu    sync.Mutex
	times []time.Time
}

func (c *rateCounter) add() {
	c.mu.Lock()
	c.times = append(c.times, time.Now())
	c.mu.Unlock()
}

// rate returns the deliveries a second within [from, from+window].
func (c *rateCounter) rate(from time.Time, window time.Duration) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.times {
		if !at.Before(from) && at.Before(from.Add(window)) {
			n++
		}
	}
	return float64(n) / window.Seconds()
}

// deferCounter counts the limited subscription's deferrals.
type deferCounter struct {
	outbox.NopMetrics
	mu       sync.Mutex
	deferred int64
}

func (m *deferCounter) Delivered(sub string, o outbox.Outcome, _ time.Duration) {
	if sub == "limited" && o == outbox.OutcomeDeferred {
		m.mu.Lock()
		m.deferred++
		m.mu.Unlock()
	}
}

// RunRateLimit runs the five kinds of run once on db (of dialect d), in
// the order of rateOrder.
func RunRateLimit(ctx context.Context, d *Dialect, db *sqlx.DB, repeat int, o RateOptions) ([]RateResult, error) {
	kinds := rateOrder(repeat)
	var out []RateResult
	for _, kind := range kinds {
		res, err := rateRun(ctx, db, kind, o)
		if err != nil {
			return out, fmt.Errorf("%s: %s: %w", d.Name, kind, err)
		}
		res.DB, res.Repeat = d.Name, repeat
		logf(o.Log, "%s: %s, repeat %d: drain %.0f events/s in %v; limited %.1f events/s, %d deferrals %s",
			d.Name, kind, repeat+1, res.Drain.Rate, res.Drain.Took.Round(time.Millisecond), res.Limited, res.Deferred, res.Drain.Note)
		out = append(out, res)
	}
	return out, nil
}

// rateRun prefills the backlogs of one kind of run, starts an engine
// with its subscriptions, and measures the drain and the limited rate.
func rateRun(ctx context.Context, db *sqlx.DB, kind string, o RateOptions) (res RateResult, err error) {
	n, window := cmp.Or(o.Drain, 50_000), cmp.Or(o.Window, 20*time.Second)
	res = RateResult{Kind: kind, Drain: DrainResult{System: kind, N: n}}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	st, err := newStore(ctx, db, UniquePrefix("rate")+"_ob")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, dropTables(ctx, db, storeTables(st)...)) }()
	limitedTypes := []outbox.EventType{OrderPlaced}
	var partner int64
	if kind == RateOther || kind == RateOtherFree {
		// Its backlog outlasts the window and the warm-up.
		limitedTypes = []outbox.EventType{Partner}
		partner = int64(float64(RateLimit) * (window + 5*time.Second).Seconds())
	}
	if err := prefillBeside(ctx, db, st.Table(), n, partner); err != nil {
		return res, err
	}
	rec := NewRecorder(int(n))
	var limited rateCounter
	m := &deferCounter{}
	ob, err := outbox.New(st, outbox.Config{Logger: quietLogger(), Metrics: m})
	if err != nil {
		return res, err
	}
	subs := []outbox.Subscription{{Name: "bench", Types: []outbox.EventType{OrderPlaced}, Handler: func(_ context.Context, ev outbox.Event) error {
		rec.Delivered(seqOf(ev.AggregateID))
		return nil
	}}}
	if kind != RateAlone {
		var rate float64
		if limitedKind(kind) {
			rate = RateLimit
		}
		subs = append(subs, outbox.Subscription{Name: "limited", Types: limitedTypes, Rate: rate,
			Handler: func(context.Context, outbox.Event) error { limited.add(); return nil }})
	}
	for _, s := range subs {
		if err := ob.Subscribe(s); err != nil {
			return res, err
		}
	}
	start, began := rec.Since(), time.Now()
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	waitDelivered(ctx, rec, n, 10*time.Minute, 20*time.Second)
	res.Drain.finish(rec, start)
	if limitedKind(kind) {
		// The window starts after a second (the burst and the gate's
		// first fill) and ends before the limited backlog does (kind
		// RateOther) or with it (RateShared: n events at RateLimit last
		// n/RateLimit seconds).
		w := min(window, time.Duration(float64(n)/RateLimit*float64(time.Second))-2*time.Second)
		if rest := time.Until(began.Add(time.Second + w)); rest > 0 {
			time.Sleep(rest)
		}
		res.Limited = limited.rate(began.Add(time.Second), w)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	err = ob.Close(cctx)
	cancel()
	m.mu.Lock()
	res.Deferred = m.deferred
	m.mu.Unlock()
	return res, err
}

// prefillBeside prefills n events of the drain and partner events of
// type Partner, interleaved a thousand of the drain's at a time, so that
// both backlogs are there from the start and the claims take them side
// by side, as if both had been published at once.
func prefillBeside(ctx context.Context, db *sqlx.DB, table string, n, partner int64) error {
	const chunk = 1000
	chunks := (n + chunk - 1) / chunk
	per := (partner + chunks - 1) / chunks
	for i, p := int64(0), int64(0); i < n; i += chunk {
		if k := min(per, partner-p); k > 0 {
			if err := prefillTyped(ctx, db, table, Partner, n+p, k); err != nil {
				return err
			}
			p += k
		}
		if err := prefillOutbox(ctx, db, table, i, min(chunk, n-i)); err != nil {
			return err
		}
	}
	return nil
}

// WriteRateLimit renders the rate-limit rows as the section "Rate
// limit"; header, if set, follows its title.
func WriteRateLimit(w io.Writer, rs []RateResult, header string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Rate limit")
	p("")
	if header != "" {
		p("%s", header)
		p("")
	}
	p("One engine (default Config) drains a prefilled backlog of one event type through an unlimited subscription: **alone**; **beside a limit on other events**: with a subscription limited to `Rate: %d` whose own backlog (of another type, a quarter as many, prefilled interleaved with the drain's: both there from the start) outlasts the measurement; **beside a limit on the same events**: the limited subscription takes the drained events too (what its gate cannot hold is deferred: the event is split, its row for the limited subscription written, many events to a transaction). Each of those two runs has a baseline, **the same, unlimited**: the same subscriptions and backlogs, the second subscription without its Rate; the drain beside a limit ÷ its baseline in the same repeat is what the limit costs the subscription beside it. The limited rate is counted over a window after a second of warm-up, with its backlog present throughout. Targets: the limited subscription receives %d ± %.0f %%; each drain beside a limit is at least %.1f of its baseline (median of the repeats). Repeats interleaved; each run beside a limit is next to its baseline, the baseline first in every other repeat, and the order of the three groups turns.", RateLimit, RateLimit, RateTolerance*100, RateBeside)
	p("")
	p("| database | run | runs | drain events/s | limited events/s | deferrals |")
	p("| --- | --- | ---: | ---: | ---: | ---: |")
	var dbs []string
	for _, r := range rs {
		if len(dbs) == 0 || dbs[len(dbs)-1] != r.DB {
			dbs = appendNew(dbs, r.DB)
		}
	}
	for _, db := range dbs {
		for _, kind := range rateKinds {
			var drain, lim, def []float64
			for _, r := range rs {
				if r.DB == db && r.Kind == kind {
					drain, lim, def = append(drain, r.Drain.Rate), append(lim, r.Limited), append(def, float64(r.Deferred))
				}
			}
			if len(drain) == 0 {
				continue
			}
			limText, defText := "–", "–"
			if limitedKind(kind) {
				limText, defText = statOf(lim).f(num), statOf(def).f(num)
			}
			p("| %s | %s | %d | %s | %s | %s |", db, kind, len(drain), statOf(drain).f(num), limText, defText)
		}
	}
	p("")
	p("| database | limited events/s, worst run | target %d ± %.0f %% | beside a limit on other events ÷ unlimited, per repeat | beside a limit on the same events ÷ unlimited, per repeat | target ≥ %.1f |", RateLimit, RateTolerance*100, RateBeside)
	p("| --- | --- | --- | --- | --- | --- |")
	for _, db := range dbs {
		writeRateTargets(p, rs, db)
	}
}

// writeRateTargets writes db's line of the targets table: each drain
// beside a limited subscription against the same drain beside the same
// subscription without its Rate, in the same repeat.
func writeRateTargets(p func(string, ...any), rs []RateResult, db string) {
	base := map[string]float64{}
	for _, r := range rs {
		if r.DB == db && !limitedKind(r.Kind) {
			base[fmt.Sprint(r.Repeat, r.Kind)] = r.Drain.Rate
		}
	}
	worst, rateOK := 0.0, true
	var other, same []float64
	for _, r := range rs {
		if r.DB != db || !limitedKind(r.Kind) {
			continue
		}
		if dev := r.Limited/RateLimit - 1; worst == 0 || abs(dev) > abs(worst/RateLimit-1) {
			worst = r.Limited
		}
		if abs(r.Limited/RateLimit-1) > RateTolerance {
			rateOK = false
		}
		if b := base[fmt.Sprint(r.Repeat, baseOf(r.Kind))]; b > 0 {
			if r.Kind == RateOther {
				other = append(other, r.Drain.Rate/b)
			} else {
				same = append(same, r.Drain.Rate/b)
			}
		}
	}
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	beside := len(other) > 0 && len(same) > 0 && statOf(other).med >= RateBeside && statOf(same).med >= RateBeside
	p("| %s | %.1f | %s | %s | %s | %s |", db, worst, mark(rateOK), ratios(other), ratios(same), mark(beside))
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// ratios renders rs, then their median and range.
func ratios(rs []float64) string {
	if len(rs) == 0 {
		return "–"
	}
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += ratio(r)
	}
	return s + " (median " + statOf(rs).f(ratio) + ")"
}

func appendNew(ss []string, s string) []string {
	for _, x := range ss {
		if x == s {
			return ss
		}
	}
	return append(ss, s)
}
