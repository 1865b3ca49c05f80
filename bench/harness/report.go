package harness

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Report is everything one `make bench` run measured.
type Report struct {
	Started, Finished time.Time
	Command           string
	Connectors        *ConnReport   `json:",omitempty"`
	Duration          time.Duration // per cell
	Repeats           int
	Concurrency       []int
	Environment       [][2]string // label, value: the machine
	DBs               []*DBReport // one per database, in run order
	Load              []LoadResult
	Notes             []string
	// OrderedHeader, if set, is printed under the section "Ordered
	// subscriptions" (a run of that section alone: its time and load).
	OrderedHeader string `json:",omitempty"`
	// Instances are the many-instances rows (issue 33, defect 4).
	Instances []InstancesResult `json:",omitempty"`
	// Inbox are the inbox rows (issue 36).
	Inbox *InboxReport `json:",omitempty"`
	// Stats are the statistics rows (issue 34).
	Stats []StatsResult `json:",omitempty"`
	// Rate are the rate-limit rows (issue 35).
	Rate []RateResult `json:",omitempty"`
	// Delayed are the delayed-events rows (issue 35).
	Delayed []DelayedResult `json:",omitempty"`
}

// DBReport is what one run measured on one database.
type DBReport struct {
	Name        string      // "MariaDB", "PostgreSQL"
	Environment [][2]string // the server's version and settings
	Settings    [][2]string // system, configuration
	Concurrency []int
	UpdateRates []float64 // batched UPDATE rows/s, one per repeat
	UpdateBatch int
	UpdateRows  int64
	Cells       []CellResult
	Drains      []DrainResult
	Memory      *DrainResult
	MemoryNote  string
	Ordered     []OrderedResult    // the keyed workload, unordered and ordered (issue 13)
	OrderedRaw  []OrderedRawResult `json:",omitempty"` // its raw SQL limit, without and with the key row
}

// DB returns the report of the named database, adding it if new.
func (r *Report) DB(name string) *DBReport {
	for _, d := range r.DBs {
		if d.Name == name {
			return d
		}
	}
	d := &DBReport{Name: name, Concurrency: r.Concurrency}
	r.DBs = append(r.DBs, d)
	return d
}

// Aggregates over repeats.
type stat struct{ med, lo, hi float64 }

func statOf(v []float64) stat {
	if len(v) == 0 {
		return stat{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{med, s[0], s[len(s)-1]}
}

func (s stat) f(format func(float64) string) string {
	if s.lo == s.hi {
		return format(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", format(s.med), format(s.lo), format(s.hi))
}

func num(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	if v < 1000 {
		return s
	}
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	return string(out)
}

func ratio(v float64) string { return fmt.Sprintf("%.2f", v) }

func dur(v float64) string {
	d := time.Duration(v)
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", v/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", v/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0f ms", v/1e6)
	default:
		return fmt.Sprintf("%.2f s", v/1e9)
	}
}

func mib(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }

// Names of the txoutbox drain rows.
var (
	EngineDrainName = "txoutbox poller (default Config)"
	// PerEventSubName and BatchSubName drain through a subscription to a
	// fake destination that takes 1 ms per call (PollBatchSize 1000).
	PerEventSubName = "txoutbox, subscription to a 1 ms destination, one event per call"
	BatchSubName    = "txoutbox, subscription to a 1 ms destination, batches of 500"
	KickedDrainName = "txoutbox, Poll driven by the harness (workaround)"
	// TunedDrainName is the drain with Watermill's tuned settings
	// (batch 1000, 10 ms poll).
	TunedDrainName = "txoutbox poller (PollBatchSize 1000, PollInterval 10ms)"
	// SplitClaimDrainName is the drain experiment with the claim split
	// into NEW and RETRY SELECTs.
	SplitClaimDrainName = "txoutbox poller, claim split NEW/RETRY (experiment)"
)

// cellsOf returns the cells of one system at one concurrency.
func (r *DBReport) cellsOf(system string, conc int) []CellResult {
	var out []CellResult
	for _, c := range r.Cells {
		if c.System == system && c.Concurrency == conc {
			out = append(out, c)
		}
	}
	return out
}

// refFor returns the commit rate of system ref at conc in the given repeat.
func (r *DBReport) refFor(ref string, conc, repeat int) float64 {
	for _, c := range r.Cells {
		if c.System == ref && c.Concurrency == conc && c.Repeat == repeat {
			return c.CommitTPS
		}
	}
	return 0
}

// isHTTP reports whether a system is one of the HTTP rows.
func isHTTP(system string) bool { return strings.HasPrefix(system, "HTTP ") }

// systems returns the systems measured, in run order: the producer
// systems (http false) or the HTTP ones.
func (r *DBReport) systems(http bool) []string {
	var out []string
	for _, c := range r.Cells {
		if isHTTP(c.System) == http && !slices.Contains(out, c.System) {
			out = append(out, c.System)
		}
	}
	return out
}

func collect(cs []CellResult, f func(CellResult) float64) stat {
	v := make([]float64, 0, len(cs))
	for _, c := range cs {
		v = append(v, f(c))
	}
	return statOf(v)
}

// ratios returns f(cell) ÷ the commit rate of system ref in the same
// repeat, per repeat.
func (r *DBReport) ratios(cs []CellResult, ref string, f func(CellResult) float64) stat {
	var v []float64
	for _, c := range cs {
		if raw := r.refFor(ref, c.Concurrency, c.Repeat); raw > 0 {
			v = append(v, f(c)/raw)
		}
	}
	return statOf(v)
}

func commitTPS(c CellResult) float64   { return c.CommitTPS }
func schedP99(c CellResult) float64    { return float64(c.SchedP99) }
func deliveredPS(c CellResult) float64 { return c.DeliveredPS }

// cpuPerTx is the process CPU time per committed transaction, in ns.
func cpuPerTx(c CellResult) float64 {
	if c.Committed == 0 {
		return 0
	}
	return float64(c.CPU) / float64(c.Committed)
}

// Target is one line of the targets table.
type Target struct {
	What, Target, Measured string
	Met                    bool
	NotRun                 bool // the run did not measure it (e.g. -concurrency left out 16)
	Info                   bool // shown for reference, no target to meet
}

func target(what, want, measured string, met bool) Target {
	return Target{What: what, Target: want, Measured: measured, Met: met}
}

func info(what, measured string) Target {
	return Target{What: what, Target: "—", Measured: measured, Info: true}
}

// Targets evaluates issue 15's targets on one database for the systems
// named hot (hot path through txmw) and cold (poller only).
func (r *DBReport) Targets(hot, cold string) []Target {
	var ts []Target
	add := func(t Target) {
		t.What = r.Name + ": " + t.What
		ts = append(ts, t)
	}
	has16 := slices.Contains(r.Concurrency, 16)
	has64 := slices.Contains(r.Concurrency, 64)

	// Producers: commit rate through txmw + Publish against the minimal
	// raw row, per concurrency; against sqlstore's row for reference.
	var vsStore []string
	for _, conc := range r.Concurrency {
		cs := r.cellsOf(hot, conc)
		s := r.ratios(cs, RawLimitName, commitTPS)
		add(Target{What: fmt.Sprintf("commit tx/s through Publish in txmw ÷ raw order + minimal outbox row, %d producer%s", conc, plural(conc)),
			Target: "≥ 0.90", Measured: s.f(ratio), Met: s.med >= 0.90, NotRun: len(cs) == 0})
		vsStore = append(vsStore, fmt.Sprintf("%d: %s", conc, r.ratios(cs, RawSqlstoreName, commitTPS).f(ratio)))
	}
	add(info("commit tx/s through Publish in txmw ÷ raw order + sqlstore's outbox row (same INSERT as txoutbox), by producers", strings.Join(vsStore, "; ")))
	r.completionModes(add, hot)

	// The outbox keeps up: delivered/s ÷ committed/s of the same cell.
	var keep []string
	keepOK, keepRun := true, false
	for _, conc := range r.Concurrency {
		cs := r.cellsOf(hot, conc)
		if len(cs) == 0 {
			continue
		}
		keepRun = true
		s := collect(cs, func(c CellResult) float64 {
			if c.CommitTPS == 0 {
				return 0
			}
			return c.DeliveredPS / c.CommitTPS
		})
		keepOK = keepOK && s.med >= 0.99
		keep = append(keep, fmt.Sprintf("%d: %s", conc, s.f(ratio)))
	}
	add(Target{What: "delivered/s ÷ committed/s, hot path, by producers", Target: "= 1 (≥ 0.99)", Measured: strings.Join(keep, "; "), Met: keepOK, NotRun: !keepRun})

	// Lost events.
	var lostParts []string
	lostOK, lostRun := true, false
	for _, sys := range []string{hot, cold, HTTPTxoutboxName} {
		var total, cells int64
		for _, conc := range r.Concurrency {
			for _, c := range r.cellsOf(sys, conc) {
				total += c.Lost
				cells++
			}
		}
		if cells == 0 {
			continue
		}
		lostRun = true
		lostOK = lostOK && total == 0
		lostParts = append(lostParts, fmt.Sprintf("%s: %d lost in %d runs", shortName(sys), total, cells))
	}
	add(Target{What: "events lost, every concurrency, every run", Target: "0", Measured: strings.Join(lostParts, "; "), Met: lostOK, NotRun: !lostRun})

	// Hot path latency at 16 producers.
	hot16 := r.cellsOf(hot, 16)
	p50 := collect(hot16, func(c CellResult) float64 { return float64(c.LatP50) })
	p99 := collect(hot16, func(c CellResult) float64 { return float64(c.LatP99) })
	add(Target{What: "hot path commit→listener p50, 16 producers", Target: "≤ 0.1 ms", Measured: p50.f(dur), Met: p50.med <= 0.1e6, NotRun: !has16 || len(hot16) == 0})
	add(Target{What: "hot path commit→listener p99, 16 producers", Target: "≤ 1 ms", Measured: p99.f(dur), Met: p99.med <= 1e6, NotRun: !has16 || len(hot16) == 0})

	// HTTP rows.
	var cpu []string
	for _, conc := range r.Concurrency {
		cs := r.cellsOf(HTTPTxoutboxName, conc)
		s := r.ratios(cs, HTTPBaselineName, commitTPS)
		add(Target{What: fmt.Sprintf("HTTP req/s, txoutbox ÷ HTTP baseline, %d client%s", conc, plural(conc)),
			Target: "≥ 0.90", Measured: s.f(ratio), Met: s.med >= 0.90, NotRun: len(cs) == 0})
		if len(cs) > 0 {
			cpu = append(cpu, fmt.Sprintf("%d: %s vs %s", conc, collect(cs, cpuPerTx).f(dur), collect(r.cellsOf(HTTPBaselineName, conc), cpuPerTx).f(dur)))
		}
	}
	http64 := r.cellsOf(HTTPTxoutboxName, 64)
	hp99 := collect(http64, func(c CellResult) float64 { return float64(c.TxP99) })
	add(Target{What: "HTTP request p99, txoutbox, 64 clients", Target: "≤ 50 ms", Measured: hp99.f(dur), Met: hp99.med <= 50e6, NotRun: !has64 || len(http64) == 0})
	if len(cpu) > 0 {
		add(info("Go CPU per request, HTTP txoutbox vs baseline (whole process: clients and server), by clients", strings.Join(cpu, "; ")))
	}

	// Drains.
	engine := func(s string) bool { return s == EngineDrainName }
	wmTuned := func(s string) bool { return s == "Watermill forwarder, tuned" }
	for _, n := range r.drainSizes() {
		ours := r.drainStat(n, engine)
		if stalled := r.drainStalled(n, engine); stalled > 0 {
			add(target(fmt.Sprintf("backlog drain %s events, txoutbox default Config", num(float64(n))), "completes",
				fmt.Sprintf("the poll loop stalled in %d run(s) (see Notes)", stalled), false))
			continue
		}
		if n == 200_000 {
			t := Target{What: "backlog drain 200,000 events, txoutbox default Config", Target: "≥ 25,000 events/s", Measured: ours.f(num) + " events/s", Met: ours.med >= 25000}
			if r.Name != MariaDB.Name {
				t.Target, t.Info = "— (≥ 25,000 on MariaDB)", true
			}
			add(t)
		}
		if theirs := r.drainStat(n, wmTuned); theirs.med > 0 && ours.med > 0 {
			x := ours.med / theirs.med
			add(target(fmt.Sprintf("backlog drain %s events, txoutbox default Config ÷ Watermill tuned", num(float64(n))), "≥ 3×",
				fmt.Sprintf("%.1f× (%s vs %s events/s)", x, num(ours.med), num(theirs.med)), x >= 3))
		}
	}
	if r.Memory != nil && len(r.Memory.Mem) > 2 {
		flat, desc := memoryFlat(r.Memory.Mem)
		add(target(fmt.Sprintf("memory while draining %s events", num(float64(r.Memory.N))), "flat (bounded by queues)", desc, flat))
	}
	return ts
}

func shortName(s string) string {
	switch s {
	case HTTPTxoutboxName:
		return "HTTP txoutbox"
	case HTTPBaselineName:
		return "HTTP baseline"
	}
	s = strings.TrimPrefix(s, "Watermill forwarder, ")
	s = strings.TrimPrefix(s, "txoutbox, ")
	return s
}

// memoryFlat reports whether the heap stayed bounded: the peak in the
// second half of the drain is no more than 1.5× (+8 MiB) the peak of the
// first half.
func memoryFlat(ms []MemSample) (bool, string) {
	half := len(ms) / 2
	var peak1, peak2, rss1, rss2 uint64
	for i, s := range ms {
		if i < half {
			peak1, rss1 = max(peak1, s.HeapInuse), max(rss1, s.RSS)
		} else {
			peak2, rss2 = max(peak2, s.HeapInuse), max(rss2, s.RSS)
		}
	}
	flat := float64(peak2) <= 1.5*float64(peak1)+8<<20
	return flat, fmt.Sprintf("heap in use peak %s (first half) → %s (second half); RSS peak %s → %s",
		mib(float64(peak1)), mib(float64(peak2)), mib(float64(rss1)), mib(float64(rss2)))
}

func (r *DBReport) drainSizes() []int64 {
	var out []int64
	for _, d := range r.Drains {
		if !slices.Contains(out, d.N) {
			out = append(out, d.N)
		}
	}
	return out
}

func (r *DBReport) drainSystems() []string {
	var out []string
	for _, d := range r.Drains {
		if !slices.Contains(out, d.System) {
			out = append(out, d.System)
		}
	}
	return out
}

// drainStat summarises the rates of the complete drains of n events by the
// matching systems.
func (r *DBReport) drainStat(n int64, match func(string) bool) stat {
	var v []float64
	for _, d := range r.Drains {
		if d.N == n && match(d.System) && d.Delivered == d.N {
			v = append(v, d.Rate)
		}
	}
	return statOf(v)
}

// drainStalled counts the drains of n events that did not finish.
func (r *DBReport) drainStalled(n int64, match func(string) bool) int {
	k := 0
	for _, d := range r.Drains {
		if d.N == n && match(d.System) && d.Delivered < d.N {
			k++
		}
	}
	return k
}

// Findings returns observations the numbers support, for the Notes.
func (r *DBReport) Findings() []string {
	var out []string
	for _, n := range r.drainSizes() {
		if k := r.drainStalled(n, func(s string) bool { return s == EngineDrainName }); k > 0 {
			out = append(out, fmt.Sprintf("%s: txoutbox's poll loop stopped polling in %d drain(s) of %s events; the rows marked \"(workaround)\" were measured with the harness calling `ob.Poll` whenever the cold queue had room.", r.Name, k, num(float64(n))))
		}
	}
	return out
}

// Targets evaluates the targets of every database, then the load test's.
func (r *Report) Targets(hot, cold string) []Target {
	var ts []Target
	for _, d := range r.DBs {
		ts = append(ts, d.Targets(hot, cold)...)
		if len(d.Ordered) > 0 {
			ts = append(ts, d.OrderedTargets()...)
		}
	}
	if r.Inbox != nil {
		ts = append(ts, r.Inbox.Targets()...)
	}
	ts = append(ts, StatsTargets(r.Stats)...)
	ts = append(ts, DelayedTargets(r.Delayed)...)
	return append(ts, LoadTargets(r.Load)...)
}

// Write renders the report as Markdown.
func (r *Report) Write(w io.Writer, hot, cold string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	title, by := "# Benchmarks", "make bench"
	if len(r.DBs) == 0 && len(r.Load) > 0 {
		title, by = "# Load test", "make bench-load"
	}
	p("%s", title)
	p("")
	p("Generated by `%s` (`%s`) on %s, in %s. Every number below comes from this one run; rerun it on your machine to check.",
		by, r.Command, r.Started.UTC().Format("2006-01-02 15:04 MST"), r.Finished.Sub(r.Started).Round(time.Second))
	p("Each cell is repeated %d time(s) (repeats interleaved, so noise spreads over all systems); a value reads **median (min–max)**. Ratios are taken against the reference measured in the same repeat on the same database, then summarised.", r.Repeats)
	p("")
	p("## Targets vs measured")
	p("")
	p("| target | wanted | measured | |")
	p("| --- | --- | --- | --- |")
	for _, t := range r.Targets(hot, cold) {
		mark, measured := "met", t.Measured
		switch {
		case t.NotRun:
			mark, measured = "not run", "—"
		case t.Info:
			mark = "info"
		case !t.Met:
			mark = "**missed**"
		}
		p("| %s | %s | %s | %s |", t.What, t.Target, measured, mark)
	}
	p("")
	p("## Machine and versions")
	p("")
	p("| | |")
	p("| --- | --- |")
	for _, e := range r.Environment {
		p("| %s | %s |", e[0], e[1])
	}
	for _, d := range r.DBs {
		for _, e := range d.Environment {
			p("| %s %s | %s |", d.Name, e[0], e[1])
		}
	}
	if len(r.DBs) > 0 {
		p("")
		p("## Workload")
		p("")
		p("Each producer loops for %v: BEGIN; INSERT one order row; publish one ~%d-byte JSON event; COMMIT. Concurrency %s producers. A listener counts deliveries. After the producers stop, the run waits for the last deliveries, then checks every committed order in the table against the listener's record: **lost** = committed order never delivered, **dups** = deliveries beyond the first.",
			r.Duration, len(Payload(123456)), joinInts(r.Concurrency))
		p("")
		p("- **raw SQL** rows are the database limit: the same transaction in `database/sql`. **Minimal outbox row**: id BINARY(16)/BYTEA (a client-side ULID), event type, aggregate id, JSON/JSONB payload, created-at, one secondary index (created_at). **sqlstore's outbox row**: the exact INSERT txoutbox issues, into a table created by sqlstore's migration. The ratios **÷ raw** are against the minimal row; **÷ sqlstore row** against sqlstore's.")
		p("- **commit tx/s**: committed transactions ÷ production time; **tx p50/p99**: BEGIN to COMMIT returned (HTTP rows: the request, sent to response read).")
		p("- **delivered/s**: distinct events delivered ÷ (last delivery − start of production), so a backlog left at the end counts against it.")
		p("- **e2e**: commit-to-listener latency: commit time taken just before COMMIT returns (txoutbox: in the first after-commit hook; raw and Watermill: right after `Commit()` returns, so a delivery seen earlier counts as 0), delivery time in the listener.")
		p("- **CPU/tx**: user+sys CPU of the whole bench process (`getrusage(RUSAGE_SELF)`) during production ÷ committed transactions. It includes the producers and, for the HTTP rows, the HTTP clients and the server alike (they share the process); the database server's CPU is not in it.")
		p("- **HTTP rows**: a `net/http` server on 127.0.0.1:0 with a chi router; one keep-alive `http.Client` (MaxIdleConnsPerHost %d) shared by the producers, each POSTing the event's JSON to /orders/{n}. *HTTP txoutbox*: `r.Use(txmw.Transactional(db, middleware.WithOutbox(ob)))`, the handler inserts the order through `txmw.Tx(ctx)` and calls `outbox.Publish` (default Config, hot path). *HTTP baseline*: the same server whose handler runs BEGIN, INSERT order, INSERT minimal outbox row, COMMIT by hand.", maxClients)
	}
	for _, d := range r.DBs {
		d.write(w, hot, cold)
	}
	for _, d := range r.DBs {
		if len(d.Ordered) > 0 {
			p("")
			r.WriteOrdered(w)
			break
		}
	}
	if len(r.Instances) > 0 {
		p("")
		WriteInstances(w, r.Instances, "")
	}
	if r.Inbox != nil {
		p("")
		r.Inbox.Write(w)
	}
	if len(r.Stats) > 0 {
		p("")
		WriteStatsDrains(w, r.Stats, "")
	}
	if len(r.Rate) > 0 {
		p("")
		WriteRateLimit(w, r.Rate, "")
	}
	if len(r.Delayed) > 0 {
		p("")
		WriteDelayed(w, r.Delayed, "")
	}
	if len(r.Load) > 0 {
		p("")
		WriteLoad(w, r.Load)
	}
	if r.Connectors != nil {
		p("")
		r.Connectors.Write(w)
	}
	var notes []string
	for _, d := range r.DBs {
		notes = append(notes, d.Findings()...)
	}
	if notes = append(notes, r.Notes...); len(notes) > 0 {
		p("")
		p("## Notes")
		p("")
		for _, n := range notes {
			p("- %s", n)
		}
	}
}

// write renders one database's sections.
func (r *DBReport) write(w io.Writer, hot, cold string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("")
	p("## %s", r.Name)
	p("")
	p("| system | configuration |")
	p("| --- | --- |")
	for _, s := range r.Settings {
		p("| %s | %s |", s[0], s[1])
	}
	if len(r.Cells) > 0 {
		p("")
		p("### %s: producer workload", r.Name)
	}
	for _, conc := range r.Concurrency {
		if len(r.cellsOf(RawLimitName, conc)) == 0 {
			continue
		}
		p("")
		p("#### %s, %d producer%s", r.Name, conc, plural(conc))
		p("")
		p("| system | commit tx/s | ÷ raw | ÷ sqlstore row | tx p50 | tx p99 | delivered/s | ÷ raw | lost | dups | CPU/tx |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, sys := range r.systems(false) {
			cs := r.cellsOf(sys, conc)
			if len(cs) == 0 {
				continue
			}
			row := []string{sys,
				collect(cs, commitTPS).f(num),
				r.ratios(cs, RawLimitName, commitTPS).f(ratio),
				r.ratios(cs, RawSqlstoreName, commitTPS).f(ratio),
				collect(cs, func(c CellResult) float64 { return float64(c.TxP50) }).f(dur),
				collect(cs, func(c CellResult) float64 { return float64(c.TxP99) }).f(dur),
			}
			if cs[0].Delivers {
				row = append(row,
					collect(cs, deliveredPS).f(num),
					r.ratios(cs, RawLimitName, deliveredPS).f(ratio),
					lossCell(cs),
					collect(cs, func(c CellResult) float64 { return float64(c.Duplicates) }).f(num))
			} else {
				row = append(row, "–", "–", "–", "–")
			}
			row = append(row, collect(cs, cpuPerTx).f(dur))
			p("| %s |", strings.Join(row, " | "))
		}
		p("")
		p("| system | e2e p50 | e2e p95 | e2e p99 | e2e max | drain tail |")
		p("| --- | --- | --- | --- | --- | --- |")
		for _, sys := range r.systems(false) {
			cs := r.cellsOf(sys, conc)
			if len(cs) == 0 || !cs[0].Delivers {
				continue
			}
			p("| %s |", strings.Join(latencyRow(sys, cs), " | "))
		}
	}
	if httpSys := r.systems(true); len(httpSys) > 0 {
		p("")
		p("### %s: HTTP over loopback", r.Name)
		p("")
		p("| clients | system | req/s | ÷ HTTP baseline | request p50 | request p99 | delivered/s | lost | dups | CPU/request |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, conc := range r.Concurrency {
			for _, sys := range httpSys {
				cs := r.cellsOf(sys, conc)
				if len(cs) == 0 {
					continue
				}
				delivered, lost, dups := "–", "–", "–"
				if cs[0].Delivers {
					delivered, lost = collect(cs, deliveredPS).f(num), lossCell(cs)
					dups = collect(cs, func(c CellResult) float64 { return float64(c.Duplicates) }).f(num)
				}
				p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", conc, sys,
					collect(cs, commitTPS).f(num),
					r.ratios(cs, HTTPBaselineName, commitTPS).f(ratio),
					collect(cs, func(c CellResult) float64 { return float64(c.TxP50) }).f(dur),
					collect(cs, func(c CellResult) float64 { return float64(c.TxP99) }).f(dur),
					delivered, lost, dups, collect(cs, cpuPerTx).f(dur))
			}
		}
		p("")
		p("| clients | system | e2e p50 | e2e p95 | e2e p99 | e2e max | drain tail |")
		p("| --- | --- | --- | --- | --- | --- | --- |")
		for _, conc := range r.Concurrency {
			for _, sys := range httpSys {
				if cs := r.cellsOf(sys, conc); len(cs) > 0 && cs[0].Delivers {
					p("| %d | %s |", conc, strings.Join(latencyRow(sys, cs), " | "))
				}
			}
		}
	}
	var notes []string
	for _, c := range r.Cells {
		if c.Note != "" || c.Errors > 0 || c.Phantoms > 0 {
			notes = append(notes, fmt.Sprintf("- %s, %d producers, repeat %d: %d errors, %d phantom deliveries. %s", c.System, c.Concurrency, c.Repeat+1, c.Errors, c.Phantoms, c.Note))
		}
	}
	if len(notes) > 0 {
		p("")
		p("Cells with errors:")
		p("")
		for _, n := range notes {
			p("%s", n)
		}
	}
	if len(r.UpdateRates) > 0 {
		p("")
		p("### %s: raw database limits", r.Name)
		p("")
		p("- Order + outbox row, and order only: the `raw SQL` rows above.")
		p("- Batched completion, `UPDATE … SET status = 1 … WHERE locked_by = ? AND status IN (0, 2) AND id IN (%d ids)` (sqlstore's MarkDone statement), one client, %s rows: **%s rows/s**.",
			r.UpdateBatch, num(float64(r.UpdateRows)), statOf(r.UpdateRates).f(num))
	}
	if len(r.Drains) > 0 {
		p("")
		p("### %s: backlog drain", r.Name)
		p("")
		p("A table prefilled with N due events (multi-row INSERTs, outside the measurement); no producers; then the consumer starts and the clock runs until the last event reaches the listener.")
		p("")
		p("| events | system | runs | events/s | time | dups | note |")
		p("| --- | --- | --- | --- | --- | --- | --- |")
		for _, n := range r.drainSizes() {
			for _, sys := range r.drainSystems() {
				var ds []DrainResult
				for _, d := range r.Drains {
					if d.N == n && d.System == sys {
						ds = append(ds, d)
					}
				}
				if len(ds) == 0 {
					continue
				}
				var rates, took, dups []float64
				var note []string
				for _, d := range ds {
					rates, took, dups = append(rates, d.Rate), append(took, float64(d.Took)), append(dups, float64(d.Duplicates))
					if d.Note != "" {
						note = append(note, d.Note)
					}
					if d.DoneRows > 0 && d.DoneRows != d.N {
						note = append(note, fmt.Sprintf("%d rows DONE after Close", d.DoneRows))
					}
				}
				p("| %s | %s | %d | %s | %s | %s | %s |", num(float64(n)), sys, len(ds), statOf(rates).f(num), statOf(took).f(dur), statOf(dups).f(num), strings.Join(note, "; "))
			}
		}
	}
	if r.Memory != nil {
		m := r.Memory
		p("")
		p("### %s: memory while draining %s events", r.Name, num(float64(m.N)))
		p("")
		p("txoutbox, default Config, in a fresh child process (prefill %v, drain %v, %s events/s, %d duplicates%s). Samples every 250 ms; Go heap from runtime.MemStats, RSS from /proc/self/status.",
			m.Prefill.Round(time.Second), m.Took.Round(time.Millisecond), num(m.Rate), m.Duplicates, noteSuffix(m.Note))
		if r.MemoryNote != "" {
			p("")
			p("%s", r.MemoryNote)
		}
		p("")
		p("| progress | t | delivered | heap alloc | heap in use | Go sys | RSS |")
		p("| --- | --- | --- | --- | --- | --- | --- |")
		for _, s := range pickSamples(m.Mem, m.N) {
			p("| %.0f%% | %s | %s | %s | %s | %s | %s |", 100*float64(s.Delivered)/float64(m.N), dur(float64(s.At-m.Mem[0].At)), num(float64(s.Delivered)),
				mib(float64(s.HeapAlloc)), mib(float64(s.HeapInuse)), mib(float64(s.GoSys)), mib(float64(s.RSS)))
		}
		var peakHeap, peakRSS uint64
		for _, s := range m.Mem {
			peakHeap, peakRSS = max(peakHeap, s.HeapInuse), max(peakRSS, s.RSS)
		}
		p("")
		p("Peak heap in use %s, peak RSS %s over %d samples.", mib(float64(peakHeap)), mib(float64(peakRSS)), len(m.Mem))
	}
}

func latencyRow(sys string, cs []CellResult) []string {
	return []string{sys,
		collect(cs, func(c CellResult) float64 { return float64(c.LatP50) }).f(dur),
		collect(cs, func(c CellResult) float64 { return float64(c.LatP95) }).f(dur),
		collect(cs, func(c CellResult) float64 { return float64(c.LatP99) }).f(dur),
		collect(cs, func(c CellResult) float64 { return float64(c.LatMax) }).f(dur),
		collect(cs, func(c CellResult) float64 { return float64(c.DrainTail) }).f(dur)}
}

func lossCell(cs []CellResult) string {
	var total, worst int64
	for _, c := range cs {
		total += c.Lost
		worst = max(worst, c.Lost)
	}
	if total == 0 {
		return "0"
	}
	var committed int64
	for _, c := range cs {
		committed += c.Orders
	}
	return fmt.Sprintf("**%s** of %s (worst run %s)", num(float64(total)), num(float64(committed)), num(float64(worst)))
}

func pickSamples(ms []MemSample, n int64) []MemSample {
	if len(ms) <= 12 {
		return ms
	}
	var out []MemSample
	next := 0.0
	for i, s := range ms {
		frac := float64(s.Delivered) / float64(n)
		if i == 0 || i == len(ms)-1 || frac >= next {
			out = append(out, s)
			for next <= frac {
				next += 0.1
			}
		}
	}
	return out
}

func noteSuffix(s string) string {
	if s == "" {
		return ""
	}
	return "; " + s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// completionModes adds the informational rows of the completion modes:
// sqlstore's DeleteDelivered against the raw reference, and
// ArchiveDelivered against the default (hot, DONE kept) and
// DeleteDelivered.
func (r *DBReport) completionModes(add func(Target), hot string) {
	// The same with sqlstore's DeleteDelivered (no DONE history).
	del := (&Txoutbox{HotPath: true, DeleteDelivered: true}).Name()
	var vsDel []string
	for _, conc := range r.Concurrency {
		if cs := r.cellsOf(del, conc); len(cs) > 0 {
			vsDel = append(vsDel, fmt.Sprintf("%d: %s", conc, r.ratios(cs, RawLimitName, commitTPS).f(ratio)))
		}
	}
	if len(vsDel) > 0 {
		add(info("commit tx/s through Publish in txmw with sqlstore's DeleteDelivered ÷ raw order + minimal outbox row, by producers", strings.Join(vsDel, "; ")))
	}
	// And with ArchiveDelivered (history moved to <table>_archive): its
	// cost against the default and DeleteDelivered.
	arch := (&Txoutbox{HotPath: true, ArchiveDelivered: true}).Name()
	var vsArch []string
	for _, conc := range r.Concurrency {
		if cs := r.cellsOf(arch, conc); len(cs) > 0 {
			vsArch = append(vsArch, fmt.Sprintf("%d: %s of default, %s of DeleteDelivered", conc,
				r.ratios(cs, hot, commitTPS).f(ratio), r.ratios(cs, del, commitTPS).f(ratio)))
		}
	}
	if len(vsArch) > 0 {
		add(info("commit tx/s through Publish in txmw with sqlstore's ArchiveDelivered ÷ the default (DONE kept) and ÷ DeleteDelivered, by producers", strings.Join(vsArch, "; ")))
	}
}
