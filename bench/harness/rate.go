package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
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
	RateAlone  = "drain alone"                             // the unlimited drain, no limited subscription
	RateOther  = "drain beside a limit on other events"    // + a limited subscription of another type's backlog
	RateShared = "drain beside a limit on the same events" // the limited subscription takes the drained events too
)

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

// RunRateLimit runs the three kinds of run once on db (of dialect d), in
// an order that turns with the repeat.
func RunRateLimit(ctx context.Context, d *Dialect, db *sqlx.DB, repeat int, o RateOptions) ([]RateResult, error) {
	kinds := []string{RateAlone, RateOther, RateShared}
	kinds = append(kinds[repeat%3:], kinds[:repeat%3]...)
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
	if err := prefillOutbox(ctx, db, st.Table(), 0, n); err != nil {
		return res, err
	}
	limitedTypes := []outbox.EventType{OrderPlaced}
	if kind == RateOther {
		// Its backlog outlasts the window and the warm-up.
		limitedTypes = []outbox.EventType{Partner}
		if err := prefillTyped(ctx, db, st.Table(), Partner, n, int64(float64(RateLimit)*(window+5*time.Second).Seconds())); err != nil {
			return res, err
		}
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
		subs = append(subs, outbox.Subscription{Name: "limited", Types: limitedTypes, Rate: RateLimit,
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
	if kind != RateAlone {
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
	p("One engine (default Config) drains a prefilled backlog of one event type through an unlimited subscription, **alone**; **beside a limit on other events**: with a subscription limited to `Rate: %d` whose own backlog (of another type) outlasts the measurement; **beside a limit on the same events**: the limited subscription takes the drained events too (each event goes to both; what the limited one's gate cannot hold is deferred, one write per event). The limited rate is counted over a window after a second of warm-up, with its backlog present throughout. Targets: the limited subscription receives %d ± %.0f %%; the drain beside a limit on other events is at least %.1f of the drain alone in the same repeat. Repeats interleaved, the order of the three turning.", RateLimit, RateLimit, RateTolerance*100, RateBeside)
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
		for _, kind := range []string{RateAlone, RateOther, RateShared} {
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
			if kind != RateAlone {
				limText, defText = statOf(lim).f(num), statOf(def).f(num)
			}
			p("| %s | %s | %d | %s | %s | %s |", db, kind, len(drain), statOf(drain).f(num), limText, defText)
		}
	}
	p("")
	p("| database | limited events/s, worst run | target %d ± %.0f %% | beside other ÷ alone, per repeat | target ≥ %.1f | beside same ÷ alone, per repeat |", RateLimit, RateTolerance*100, RateBeside)
	p("| --- | --- | --- | --- | --- | --- |")
	for _, db := range dbs {
		writeRateTargets(p, rs, db)
	}
}

// writeRateTargets writes db's line of the targets table.
func writeRateTargets(p func(string, ...any), rs []RateResult, db string) {
	alone := map[int]float64{}
	for _, r := range rs {
		if r.DB == db && r.Kind == RateAlone {
			alone[r.Repeat] = r.Drain.Rate
		}
	}
	worst, rateOK := 0.0, true
	var other, same []float64
	for _, r := range rs {
		if r.DB != db || r.Kind == RateAlone {
			continue
		}
		if dev := r.Limited/RateLimit - 1; worst == 0 || abs(dev) > abs(worst/RateLimit-1) {
			worst = r.Limited
		}
		if abs(r.Limited/RateLimit-1) > RateTolerance {
			rateOK = false
		}
		if a := alone[r.Repeat]; a > 0 {
			if r.Kind == RateOther {
				other = append(other, r.Drain.Rate/a)
			} else {
				same = append(same, r.Drain.Rate/a)
			}
		}
	}
	mark := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	p("| %s | %.1f | %s | %s | %s | %s |", db, worst, mark(rateOK), ratios(other), mark(len(other) > 0 && statOf(other).med >= RateBeside), ratios(same))
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
