package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// OrderedProducers is how many producers the ordered workload runs
// (issue 13).
const OrderedProducers = 16

// OrderedKeys is how many ordering keys the ordered workload spreads its
// events over: 1,000 (issue 13); a diagnosis may change it (-ordered-keys).
var OrderedKeys = 1000

// Keyed is the hot-path txoutbox system (txmw.Transact + outbox.Publish,
// default Config) with every event on one of Keys ordering keys, chosen at
// random, delivered to one subscription with the given Order. Both the
// Unordered and the Ordered row run exactly this workload, so that their
// ratio is the cost of ordering alone.
//
// Order check: the producers of one key are serialised by a per-key mutex
// held across the whole transaction, and each takes the key's next number n
// under it; so a key's n grows in the key's commit order, which is the order
// an ordered subscription guarantees. The handler looks up the key and n of
// the event (by the event number the AggregateID carries) and counts an
// order violation when n is below the last n it saw for the key.
type Keyed struct {
	Keys  int
	Order outbox.Order
	// Instances is how many outbox instances (one process, one store
	// table, InstanceIDs of their own) share the producers, event by
	// event; 0 or 1: one.
	Instances int
	// PollInterval, if set, overrides Config.PollInterval (diagnosis:
	// whether slow events wait for the poller's sweep).
	PollInterval time.Duration

	env   *Env
	store *countingStore
	obs   []*outbox.Outbox
	M     Counters

	keyOf []atomic.Int32 // event number → key
	nOf   []atomic.Int64 // event number → n of its key
	pmu   []sync.Mutex   // per key, held by a producer across its transaction
	pn    []int64        // per key, last n handed out (under pmu)
	hmu   []sync.Mutex   // per key, the handler's check
	last  []int64        // per key, highest n delivered (under hmu)

	violations atomic.Int64
	q          string
}

// Name is the row label.
func (s *Keyed) Name() string {
	if s.Instances > 1 {
		return fmt.Sprintf("txoutbox, hot path, %d keys, %s, %d instances (%s)", s.Keys, s.Order, s.Instances, ViaTransact)
	}
	return fmt.Sprintf("txoutbox, hot path, %d keys, %s (%s)", s.Keys, s.Order, ViaTransact)
}

func (s *Keyed) Delivers() bool { return true }

// Violations returns how many events reached the handler after a later
// event of their key.
func (s *Keyed) Violations() int64 { return s.violations.Load() }

func (s *Keyed) Setup(ctx context.Context, env *Env) error {
	s.env = env
	s.alloc(len(env.Rec.commit))
	s.q = insertOrderSQL(env.DB, env.Orders)
	st, err := newStore(ctx, env.DB, env.Prefix+"_ob")
	if err != nil {
		return err
	}
	s.store = &countingStore{Store: st, m: &s.M}
	for i := range max(1, s.Instances) {
		cfg := txoutboxConfig(true, &s.M)
		if s.Instances > 1 {
			cfg.InstanceID = fmt.Sprintf("%s-%d", env.Prefix, i)
		}
		if s.PollInterval > 0 {
			cfg.PollInterval, cfg.PollMaxInterval = s.PollInterval, s.PollInterval
		}
		ob, err := outbox.New(s.store, cfg)
		if err != nil {
			return err
		}
		if err := ob.Subscribe(outbox.Subscription{Name: "bench", Types: []outbox.EventType{OrderPlaced}, Order: s.Order,
			Handler: func(_ context.Context, ev outbox.Event) error {
				seq := seqOf(ev.AggregateID)
				s.check(seq)
				env.Rec.Delivered(seq)
				return nil
			}}); err != nil {
			return err
		}
		s.obs = append(s.obs, ob)
		if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	return nil
}

// alloc sizes the per-event and per-key state for n events.
func (s *Keyed) alloc(n int) {
	s.keyOf, s.nOf = make([]atomic.Int32, n), make([]atomic.Int64, n)
	s.pmu, s.pn = make([]sync.Mutex, s.Keys), make([]int64, s.Keys)
	s.hmu, s.last = make([]sync.Mutex, s.Keys), make([]int64, s.Keys)
}

// check records the delivery of event seq against its key's last
// delivered number, counting a violation if it is earlier.
func (s *Keyed) check(seq int64) {
	if seq < 0 || seq >= int64(len(s.keyOf)) {
		return
	}
	k, n := s.keyOf[seq].Load(), s.nOf[seq].Load()
	s.hmu[k].Lock()
	if n < s.last[k] {
		s.violations.Add(1)
	} else {
		s.last[k] = n
	}
	s.hmu[k].Unlock()
}

func (s *Keyed) quietPeriod() time.Duration {
	c := s.obs[0].Config()
	return c.PollMaxInterval + c.PollInterval + max(0, c.SkipRecent) + 2*time.Second
}

func (s *Keyed) Tx(ctx context.Context, seq int64, payload []byte) error {
	k := rand.IntN(s.Keys)
	s.pmu[k].Lock()
	defer s.pmu[k].Unlock()
	s.pn[k]++
	s.keyOf[seq].Store(int32(k))
	s.nOf[seq].Store(s.pn[k])
	ctx = outbox.NewContext(ctx, s.obs[seq%int64(len(s.obs))])
	return txmw.Transact(ctx, s.env.DB, func(ctx context.Context, tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, s.q, orderArgs(seq)...); err != nil {
			return err
		}
		if err := outbox.AfterCommit(ctx, func() { s.env.Rec.Committed(seq) }); err != nil {
			return err
		}
		env := envelope(seq, payload)
		env.OrderingKey = "key-" + strconv.Itoa(k)
		_, err := outbox.Publish(ctx, env)
		return err
	})
}

func (s *Keyed) Teardown(ctx context.Context) error {
	var err error
	for _, ob := range s.obs {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = errors.Join(err, ob.Close(cctx))
		cancel()
	}
	if s.store != nil {
		if derr := dropTables(ctx, s.env.DB, storeTables(s.store.Store)...); err == nil {
			err = derr
		}
	}
	return err
}

// OrderedResult is one run of the keyed workload.
type OrderedResult struct {
	CellResult
	Order      string // "unordered", "ordered"
	Instances  int    // outbox instances sharing the producers (1: one)
	Keys       int
	Violations int64
	Hot, Cold  int64 // events through the hot queue, and queued by the poller or the sequencer
	Claims     int64
}

// OrderedPollInterval, if set, is the PollInterval of the ordered rows
// (diagnosis only; the report's rows use the default Config).
var OrderedPollInterval time.Duration

// RunOrdered runs the keyed workload once with order o, on the given
// number of outbox instances.
func RunOrdered(ctx context.Context, db *sqlx.DB, o outbox.Order, instances int, opts CellOptions) (OrderedResult, error) {
	sys := &Keyed{Keys: OrderedKeys, Order: o, Instances: max(1, instances), PollInterval: OrderedPollInterval}
	opts.Concurrency = OrderedProducers
	opts.SchedProbe = true
	res, err := RunCell(ctx, db, sys, opts)
	h, _, c := sys.M.Paths()
	_, _, cl := sys.M.Statements()
	return OrderedResult{CellResult: res, Order: o.String(), Instances: sys.Instances, Keys: sys.Keys, Violations: sys.Violations(), Hot: h, Cold: c, Claims: cl}, err
}

// ordered returns the runs of the given order on one instance.
func (r *DBReport) ordered(order string) []CellResult {
	var cs []CellResult
	for _, o := range r.Ordered {
		if o.Order == order && o.Instances <= 1 {
			cs = append(cs, o.CellResult)
		}
	}
	return cs
}

// orderedRatios is ordered ÷ unordered commit tx/s, per repeat.
func (r *DBReport) orderedRatios() stat {
	by := map[int]float64{}
	for _, o := range r.Ordered {
		if o.Order == outbox.Unordered.String() && o.Instances <= 1 {
			by[o.Repeat] = o.CommitTPS
		}
	}
	var v []float64
	for _, o := range r.Ordered {
		if u := by[o.Repeat]; o.Order == outbox.Ordered.String() && o.Instances <= 1 && u > 0 {
			v = append(v, o.CommitTPS/u)
		}
	}
	return statOf(v)
}

// logBytesPerTx is the database's write-ahead log written per committed
// transaction, or -1 if it was not read.
func logBytesPerTx(c CellResult) float64 {
	if c.LogBytes < 0 || c.Committed == 0 {
		return -1
	}
	return float64(c.LogBytes) / float64(c.Committed)
}

// logPerTx renders the median log bytes per transaction of cs, "—" if
// any was not read.
func logPerTx(cs []CellResult) string {
	for _, c := range cs {
		if logBytesPerTx(c) < 0 {
			return "—"
		}
	}
	return collect(cs, logBytesPerTx).f(func(v float64) string { return num(v) + " B" })
}

// orderedLogRatios is ordered ÷ unordered log bytes per transaction, per
// repeat (repeats where either was not read are left out).
func (r *DBReport) orderedLogRatios() (stat, int) {
	by := map[int]float64{}
	for _, o := range r.Ordered {
		if o.Order == outbox.Unordered.String() && o.Instances <= 1 {
			by[o.Repeat] = logBytesPerTx(o.CellResult)
		}
	}
	var v []float64
	for _, o := range r.Ordered {
		if u, l := by[o.Repeat], logBytesPerTx(o.CellResult); o.Order == outbox.Ordered.String() && o.Instances <= 1 && u > 0 && l >= 0 {
			v = append(v, l/u)
		}
	}
	return statOf(v), len(v)
}

// OrderedTargets evaluates issue 13's targets on one database.
func (r *DBReport) OrderedTargets() []Target {
	ord := r.ordered(outbox.Ordered.String())
	notRun := len(ord) == 0
	p50 := collect(ord, func(c CellResult) float64 { return float64(c.LatP50) })
	p99 := collect(ord, func(c CellResult) float64 { return float64(c.LatP99) })
	rt := r.orderedRatios()
	var viol, lost int64
	for _, o := range r.Ordered {
		if o.Order == outbox.Ordered.String() {
			viol += o.Violations // on any number of instances
			lost += o.Lost
		}
	}
	w := fmt.Sprintf("ordered subscription, %d producers, %s keys", OrderedProducers, num(float64(OrderedKeys)))
	return []Target{
		{What: r.Name + ": " + w + ", commit→handler p50", Target: "≤ 0.1 ms", Measured: p50.f(dur), Met: p50.med <= 0.1e6, NotRun: notRun},
		{What: r.Name + ": " + w + ", commit→handler p99", Target: "≤ 1 ms", Measured: p99.f(dur), Met: p99.med <= 1e6, NotRun: notRun},
		{What: r.Name + ": " + w + ", commit tx/s ordered ÷ unordered (same run)", Target: "≥ 0.90", Measured: rt.f(ratio), Met: rt.med >= 0.90, NotRun: notRun},
		{What: r.Name + ": " + w + ", order violations and lost events, every run", Target: "0", Measured: fmt.Sprintf("%d violations, %d lost in %d runs", viol, lost, len(ord)), Met: viol == 0 && lost == 0, NotRun: notRun},
		{What: r.Name + ": the same runs, how late a goroutine of the bench process that slept 1 ms ran (the process's scheduling delay, which every in-process hand-off is exposed to), p99, unordered / ordered", Target: "—",
			Measured: collect(r.ordered(outbox.Unordered.String()), schedP99).f(dur) + " / " + collect(ord, schedP99).f(dur), Info: true, NotRun: notRun},
	}
}

// WriteOrdered renders the section "Ordered subscriptions".
func (r *Report) WriteOrdered(w io.Writer) {
	var dbs []*DBReport
	for _, d := range r.DBs {
		if len(d.Ordered) > 0 || len(d.OrderedRaw) > 0 {
			dbs = append(dbs, d)
		}
	}
	if len(dbs) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Ordered subscriptions")
	p("")
	p("Issue 13: an ordered subscription at %d producers over %s keys keeps commit→handler p50 ≤ 0.1 ms and p99 ≤ 1 ms, and ≥ 0.9 of the unordered throughput, in the same run.", OrderedProducers, num(float64(OrderedKeys)))
	p("")
	p("Workload: the hot-path producer workload above (txmw.Transact: INSERT order, `outbox.Publish`, COMMIT; default Config), %d producers for %v, each event with `OrderingKey` one of %s keys at random, one subscription. The two rows differ only in `Subscription.Order` (Unordered, Ordered); each repeat runs the unordered row, then the ordered one, on fresh tables. The row **ordered, 2 instances** (when run; no target of its own) is the ordered row on two outbox instances in the process (InstanceIDs of their own, one table), each event published on one of them by the parity of its number: about half of a key's consecutive events change instance, and such an event, published behind one the other instance holds, waits in the table until that instance has delivered its predecessor, recorded it and claimed it (the cross-instance path). The producers of one key are serialised by a per-key mutex held across the transaction and number the key's events 1, 2, 3… under it; the handler counts an **order violation** when an event's number is below the last one it saw for its key. The same check runs on the unordered row, where nothing promises it. **ordered ÷ unordered** is the commit rate of the ordered row ÷ that of the unordered row of the same repeat. **paths**: events through the hot queue / queued by the poller or the sequencer (the sequencer's claims of a key's next head and the poller's sweeps). **DB log/tx**: the bytes the database server wrote to its write-ahead log during production (MariaDB's redo LSN, PostgreSQL's WAL insert position) ÷ committed transactions, the completions' writes included: it moves little with the machine's noise, so a design's extra writes show in it where the commit rates of two runs cannot be told apart. **sched delay p99**: during production a goroutine of the bench process sleeps 1 ms in a loop and records how late it ran; the 99th percentile of that lateness is how long a goroutine of this process that became runnable could wait for a CPU at that moment. Every in-process hand-off (the hot path's queue to its delivery worker included) is exposed to the same wait, so where it is near or above a commit→handler p99, that p99 is the machine's scheduling, not the engine's work (a goroutine woken by a channel send may run sooner than one woken by a timer: Go runs it next on the sender's CPU).",
		OrderedProducers, r.Duration, num(float64(OrderedKeys)))
	if r.OrderedHeader != "" {
		p("")
		p("%s", r.OrderedHeader)
	}
	var raw []string
	for _, d := range dbs {
		if len(d.OrderedRaw) > 0 {
			raw = append(raw, fmt.Sprintf("%s **%s** (per repeat: %s)", d.Name, d.rawFloor().f(ratio), d.rawFloorPerRepeat()))
		}
	}
	if len(raw) > 0 {
		p("")
		p("The **raw** rows are the database limit of the same workload: the same producers, keys, per-key mutex, order row and payload, in `database/sql` with no subscription. *%s*: BEGIN; INSERT order; INSERT the minimal outbox row (as in the producer tables) with two more columns, the event's ordering key and its number in the key (the producer's own count, taken under the key's mutex); COMMIT. *%s*: the same, with the key's row in a key table like sqlstore's `<table>_keys` (ordering_key VARCHAR(255) primary key, seq, done_seq) upserted in the transaction by the statements of sqlstore's `InsertOrdered`, the number taken from it: on MariaDB the `INSERT … ON DUPLICATE KEY UPDATE seq = LAST_INSERT_ID(…)` then the outbox INSERT with the number bound; on PostgreSQL one statement, `WITH k AS (INSERT … ON CONFLICT (ordering_key) DO UPDATE SET seq = k.seq + 1 RETURNING …) INSERT INTO outbox … (SELECT seq FROM k)`. Each repeat runs the two raw rows first, then the unordered and ordered rows, on fresh tables.",
			RawKeyedName, RawKeyRowName)
		p("")
		p("**raw floor: key row ÷ no key row (same run)**, the commit rate of the second raw row ÷ that of the first in the same repeat: %s. It is the ceiling for ordered ÷ unordered of any design that writes a per-key row in the publishing transaction, measured on transactions that do nothing else (work a design adds to both its rows, such as the outbox library's own per-transaction cost, dilutes the key row's share and can lift that design's ratio above it).",
			strings.Join(raw, "; "))
	}
	p("")
	p("| target | wanted | measured | |")
	p("| --- | --- | --- | --- |")
	for _, d := range dbs {
		for _, t := range d.OrderedTargets() {
			writeTarget(p, t)
		}
	}
	for _, d := range dbs {
		p("")
		p("### %s: ordered subscriptions", d.Name)
		p("")
		p("| row | commit tx/s | delivered/s | commit→handler p50 | p99 | max | failed tx | delivered | lost | dups | order violations | paths hot / cold | DB log/tx | sched delay p99 |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		if len(d.OrderedRaw) > 0 {
			for _, name := range []string{RawKeyedName, RawKeyRowName} {
				var cs []CellResult
				var errs int64
				for _, o := range d.OrderedRaw {
					if o.System == name {
						cs = append(cs, o.CellResult)
						errs += o.Errors
					}
				}
				if len(cs) > 0 {
					p("| %s | %s | — | — | — | — | %d | — | — | — | — | — | %s | — |", name, collect(cs, commitTPS).f(num), errs, logPerTx(cs))
				}
			}
			p("| raw floor: key row ÷ no key row (same run) | **%s** | — | — | — | — | — | — | — | — | — | — | — | — |", d.rawFloor().f(ratio))
		}
		for _, row := range d.orderedRows() {
			var cs []CellResult
			var errs, delivered, lost, dups, viol, hot, cold int64
			for _, o := range d.Ordered {
				if o.rowName() == row {
					cs = append(cs, o.CellResult)
					errs, delivered, lost, dups, viol, hot, cold = errs+o.Errors, delivered+o.Delivered, lost+o.Lost, dups+o.Duplicates, viol+o.Violations, hot+o.Hot, cold+o.Cold
				}
			}
			if len(cs) == 0 {
				continue
			}
			p("| %s | %s | %s | %s | %s | %s | %d | %s | %d | %d | %d | %s / %s | %s | %s |", row,
				collect(cs, commitTPS).f(num), collect(cs, deliveredPS).f(num),
				collect(cs, func(c CellResult) float64 { return float64(c.LatP50) }).f(dur),
				collect(cs, func(c CellResult) float64 { return float64(c.LatP99) }).f(dur),
				collect(cs, func(c CellResult) float64 { return float64(c.LatMax) }).f(dur), errs,
				num(float64(delivered)), lost, dups, viol, num(float64(hot)), num(float64(cold)), logPerTx(cs), collect(cs, schedP99).f(dur))
		}
		p("")
		p("ordered ÷ unordered commit tx/s: **%s**; per repeat: %s. Counts (failed transactions, delivered, lost, dups, violations, paths) are totals over %d repeat(s).",
			d.orderedRatios().f(ratio), d.orderedPerRepeat(), len(d.ordered(outbox.Ordered.String())))
		if lr, n := d.orderedLogRatios(); n > 0 {
			p("")
			p("DB log/tx ordered ÷ unordered (same run): **%s**.", lr.f(ratio))
		}
		if len(d.OrderedRaw) > 0 {
			p("")
			p("raw floor: key row ÷ no key row (same run): **%s**; per repeat: %s.", d.rawFloor().f(ratio), d.rawFloorPerRepeat())
		}
	}
}

// rawFloors is, per repeat, the commit rate of the raw key-row cell ÷
// that of the raw cell without it, with the repeat and the two rates.
func (r *DBReport) rawFloors() (ratios []float64, reps []int, with, without []float64) {
	by := map[int]float64{}
	for _, o := range r.OrderedRaw {
		if !o.KeyRow {
			by[o.Repeat] = o.CommitTPS
		}
	}
	for _, o := range r.OrderedRaw {
		if u := by[o.Repeat]; o.KeyRow && u > 0 {
			ratios, reps = append(ratios, o.CommitTPS/u), append(reps, o.Repeat)
			with, without = append(with, o.CommitTPS), append(without, u)
		}
	}
	return ratios, reps, with, without
}

// rawFloor is the raw floor over the repeats.
func (r *DBReport) rawFloor() stat {
	v, _, _, _ := r.rawFloors()
	return statOf(v)
}

func (r *DBReport) rawFloorPerRepeat() string {
	v, reps, with, without := r.rawFloors()
	parts := make([]string, len(v))
	for i := range v {
		parts[i] = fmt.Sprintf("%d. %s (%s ÷ %s tx/s)", reps[i]+1, ratio(v[i]), num(with[i]), num(without[i]))
	}
	return strings.Join(parts, "; ")
}

// rowName is the label of o's row: its order, and its instances if more
// than one.
func (o OrderedResult) rowName() string {
	if o.Instances > 1 {
		return fmt.Sprintf("%s, %d instances", o.Order, o.Instances)
	}
	return o.Order
}

// orderedRows returns the labels of the rows, in the order first run.
func (r *DBReport) orderedRows() []string {
	var rows []string
	for _, o := range r.Ordered {
		if n := o.rowName(); !slices.Contains(rows, n) {
			rows = append(rows, n)
		}
	}
	return rows
}

func (r *DBReport) orderedPerRepeat() string {
	var parts []string
	for _, o := range r.Ordered {
		parts = append(parts, fmt.Sprintf("%d. %s %s/s p50 %s p99 %s", o.Repeat+1, o.rowName(), num(o.CommitTPS), dur(float64(o.LatP50)), dur(float64(o.LatP99))))
	}
	return strings.Join(parts, "; ")
}

func writeTarget(p func(string, ...any), t Target) {
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

// SpliceSection replaces the section that starts with the heading line
// head ("## …") in the file path, up to the next heading of the same
// level, with section; without one, it goes before "## Notes", or at the
// end. A missing file is created with the section alone.
func SpliceSection(path, head string, section []byte) error {
	old, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return os.WriteFile(path, section, 0o644)
	}
	if err != nil {
		return err
	}
	s := string(old)
	sec := strings.TrimRight(string(section), "\n") + "\n\n"
	if i := strings.Index(s, "\n"+head+"\n"); i >= 0 {
		rest := s[i+1+len(head)+1:]
		end := len(s)
		if j := strings.Index(rest, "\n## "); j >= 0 {
			end = i + 1 + len(head) + 1 + j + 1
		}
		s = s[:i+1] + sec + s[end:]
	} else if i := strings.Index(s, "\n## Notes\n"); i >= 0 {
		s = s[:i+1] + sec + s[i+1:]
	} else {
		s = strings.TrimRight(s, "\n") + "\n\n" + sec
	}
	return os.WriteFile(path, []byte(strings.TrimRight(s, "\n")+"\n"), 0o644)
}
