package harness

import (
	"context"
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
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The many-instances row (issue 33, defect 4): many engines on one table
// under a steady publish load, then Close with a short context. It reports
// the p99 of each kind of engine write and the events acknowledged (their
// handler returned nil) but left not DONE after Close.

// InstancesOptions configure RunInstances.
type InstancesOptions struct {
	// Instances is the number of engines, in this process, each with a
	// store of its own on one table. Defaults to 50.
	Instances int
	// PollInterval is every engine's Config.PollInterval (and
	// PollMaxInterval, so that the poll keeps its pace); 0 is the default
	// Config.
	PollInterval time.Duration
	// Rate is the publish load, in events per second over all producers.
	// Defaults to 500.
	Rate int
	// Producers publish concurrently. Defaults to 8.
	Producers int
	// PerTx is the events each producer's transaction publishes.
	// Defaults to 1.
	PerTx int
	// HotEvery: every HotEvery-th transaction publishes through a
	// subscribing engine (its hot path), the others through an engine
	// without subscriptions. Negative: none. Defaults to 2 (half).
	HotEvery int
	// Duration is how long the load runs before Close. Defaults to 20s.
	Duration time.Duration
	// CloseTimeout is the context each engine's Close gets; all close at
	// once. Defaults to 5s.
	CloseTimeout time.Duration
	// Pool is the connections the engines share (one *sqlx.DB, as in one
	// process); the producers have a pool of their own. Defaults to 64.
	Pool int
	// Prefix names the tables.
	Prefix string
	// Log receives progress lines; nil: none.
	Log func(format string, args ...any)
}

func (o *InstancesOptions) defaults() {
	o.Instances = cmpOr(o.Instances, 50)
	o.Rate = cmpOr(o.Rate, 500)
	o.Producers = cmpOr(o.Producers, 8)
	o.PerTx = cmpOr(o.PerTx, 1)
	o.HotEvery = cmpOr(o.HotEvery, 2)
	o.Duration = cmpOr(o.Duration, 20*time.Second)
	o.CloseTimeout = cmpOr(o.CloseTimeout, 5*time.Second)
	o.Pool = cmpOr(o.Pool, 64)
	if o.Prefix == "" {
		o.Prefix = UniquePrefix("mi")
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// StatementStats are the timings of one kind of engine write.
type StatementStats struct {
	Name          string
	Count         int
	Rows          int
	P50, P99, Max time.Duration
}

// InstancesResult is one run of RunInstances.
type InstancesResult struct {
	DB           string
	Instances    int
	PollInterval time.Duration // 0: the default
	Rate         int
	Duration     time.Duration
	Published    int64 // committed events
	Acked        int64 // distinct events a handler returned nil for
	Duplicates   int64 // handler calls beyond the first of an event
	// NotDone is the acknowledged events not DONE after every Close
	// returned.
	NotDone int
	// Pending is the events of the table not DONE after Close (delivered
	// or not).
	Pending int
	// CloseMax is the longest Close; CloseErrors how many returned an
	// error (CloseError is one of them).
	CloseMax    time.Duration
	CloseErrors int
	CloseError  string
	Statements  []StatementStats // claim, mark_done, extend_leases, release
	// LockWaits and LockWaitTime are the server's row-lock waits over the
	// run (MariaDB: Innodb_row_lock_waits, Innodb_row_lock_time); -1 if
	// unknown.
	LockWaits    int64
	LockWaitTime time.Duration
	// PoolWaits and PoolWaitTime are the engines' waits for a connection
	// of their shared pool.
	PoolWaits    int64
	PoolWaitTime time.Duration
	Load         string // load average at the end
}

// statementLog is an outbox.Metrics that keeps every engine write's
// duration, by statement name.
type statementLog struct {
	outbox.NopMetrics
	mu   sync.Mutex
	took map[string][]time.Duration
	rows map[string]int
}

func (l *statementLog) Statement(name string, rows int, took time.Duration) {
	l.mu.Lock()
	l.took[name] = append(l.took[name], took)
	l.rows[name] += rows
	l.mu.Unlock()
}

func (l *statementLog) stats() []StatementStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []StatementStats
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range l.took {
			if !yield(k) {
				return
			}
		}
	}) {
		d := slices.Clone(l.took[name])
		slices.Sort(d)
		out = append(out, StatementStats{Name: name, Count: len(d), Rows: l.rows[name],
			P50: quantile(d, 0.50), P99: quantile(d, 0.99), Max: d[len(d)-1]})
	}
	return out
}

// Stat returns the stats of the named statement (zero if none ran).
func (r *InstancesResult) Stat(name string) StatementStats {
	for _, s := range r.Statements {
		if s.Name == name {
			return s
		}
	}
	return StatementStats{Name: name}
}

// RunInstances runs o.Instances engines, each with a store of its own on
// one fresh table, under a steady load of o.Rate events a second: half
// published through a subscribing engine (its hot path), half through an
// engine without subscriptions (the claims of the others find them), as a
// bridge whose publisher does not subscribe does. After o.Duration every
// engine is closed at once, each with o.CloseTimeout, and the table is
// read: every event a handler acknowledged must be DONE.
func RunInstances(ctx context.Context, d *Dialect, dsn string, o InstancesOptions) (res InstancesResult, err error) {
	o.defaults()
	res = InstancesResult{DB: d.Name, Instances: o.Instances, PollInterval: o.PollInterval, Rate: o.Rate, Duration: o.Duration, LockWaits: -1}
	open := func(n int) (*sqlx.DB, error) {
		db, err := sqlx.Open(d.Driver, dsn)
		if err != nil {
			return nil, err
		}
		db.SetMaxOpenConns(n)
		db.SetMaxIdleConns(n)
		return db, db.PingContext(ctx)
	}
	edb, err := open(o.Pool)
	if err != nil {
		return res, err
	}
	defer edb.Close()
	pdb, err := open(o.Producers + 2)
	if err != nil {
		return res, err
	}
	defer pdb.Close()
	table := o.Prefix + "_ob"
	first, err := newStore(ctx, edb, table)
	if err != nil {
		return res, err
	}
	defer dropTables(ctx, edb, storeTables(first)...)

	m := &statementLog{took: map[string][]time.Duration{}, rows: map[string]int{}}
	var acked sync.Map // id → struct{}
	var nacked, dups atomic.Int64
	cfg := func(i int) outbox.Config {
		c := outbox.Config{InstanceID: fmt.Sprintf("%s-%02d", o.Prefix, i), Logger: quietLogger(), Metrics: m}
		if o.PollInterval > 0 {
			c.PollInterval, c.PollMaxInterval = o.PollInterval, o.PollInterval
		}
		return c
	}
	obs := make([]*outbox.Outbox, o.Instances)
	for i := range obs {
		st, err := sqlstore.New(edb, sqlstore.Options{Table: table})
		if err != nil {
			return res, err
		}
		ob, err := outbox.New(st, cfg(i))
		if err != nil {
			return res, err
		}
		ob.Handle("bridge", func(_ context.Context, ev outbox.Event) error {
			if _, loaded := acked.LoadOrStore(ev.ID, struct{}{}); loaded {
				dups.Add(1)
			} else {
				nacked.Add(1)
			}
			return nil
		}, OrderPlaced)
		if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
			return res, err
		}
		obs[i] = ob
	}
	pst, err := sqlstore.New(pdb, sqlstore.Options{Table: table})
	if err != nil {
		return res, err
	}
	publisher, err := outbox.New(pst, outbox.Config{InstanceID: o.Prefix + "-pub", Logger: quietLogger(), DisablePoller: true})
	if err != nil {
		return res, err
	}
	if err := publisher.Start(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	defer publisher.Close(context.WithoutCancel(ctx))

	lw0, lt0 := lockWaits(ctx, d, edb)
	o.Log("%s: %d instances, poll %v, %d events/s for %v", d.Name, o.Instances, pollName(o.PollInterval), o.Rate, o.Duration)
	var published atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, o.Duration)
	var wg sync.WaitGroup
	per := time.Duration(float64(time.Second) * float64(o.Producers*o.PerTx) / float64(o.Rate))
	for p := range o.Producers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(p), 33))
			t := time.NewTicker(per)
			defer t.Stop()
			for n := 0; ; n++ {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
				}
				via := publisher
				if o.HotEvery > 0 && n%o.HotEvery == 0 {
					via = obs[rnd.IntN(len(obs))]
				}
				if publishTx(runCtx, pdb, via, p, n, o.PerTx) == nil {
					published.Add(int64(o.PerTx))
				}
			}
		})
	}
	wg.Wait()
	stop()
	o.Log("%s: load done (%d published, %d acknowledged); closing %d instances with %v each", d.Name, published.Load(), nacked.Load(), len(obs), o.CloseTimeout)

	res.CloseMax, res.CloseErrors, res.CloseError = closeInstances(ctx, obs, o.CloseTimeout)
	lw1, lt1 := lockWaits(ctx, d, edb)
	if lw0 >= 0 && lw1 >= 0 {
		res.LockWaits, res.LockWaitTime = lw1-lw0, lt1-lt0
	}
	ps := edb.Stats()
	res.PoolWaits, res.PoolWaitTime = ps.WaitCount, ps.WaitDuration
	res.Published, res.Acked, res.Duplicates = published.Load(), nacked.Load(), dups.Load()
	res.Statements = m.stats()

	// Every acknowledged event must be DONE (the table keeps them).
	if res.Pending, res.NotDone, err = countNotDone(ctx, edb, first.Table(), &acked); err != nil {
		return res, err
	}
	res.Load = loadAverage()
	return res, nil
}

// closeInstances closes every engine of obs at once, each with timeout,
// and returns the longest Close, the number that failed and one error.
func closeInstances(ctx context.Context, obs []*outbox.Outbox, timeout time.Duration) (longest time.Duration, failed int, msg string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, ob := range obs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
			defer cancel()
			start := time.Now()
			err := ob.Close(cctx)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			longest = max(longest, took)
			if err != nil {
				failed++
				msg = err.Error()
			}
		})
	}
	wg.Wait()
	return longest, failed, msg
}

// countNotDone returns the rows of table not DONE, and how many of them
// are in acked.
func countNotDone(ctx context.Context, db *sqlx.DB, table string, acked *sync.Map) (pending, notDone int, err error) {
	rows, err := db.QueryxContext(ctx, `SELECT id FROM `+table+` WHERE status <> 1`)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, 0, err
		}
		pending++
		if _, ok := acked.Load(id); ok {
			notDone++
		}
	}
	return pending, notDone, rows.Err()
}

func pollName(d time.Duration) string {
	if d == 0 {
		return "default (" + outbox.DefaultPollInterval.String() + ")"
	}
	return d.String()
}

// publishTx commits k events through ob in a transaction of its own.
func publishTx(ctx context.Context, db *sqlx.DB, ob *outbox.Outbox, p, n, k int) error {
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i := range k {
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: OrderPlaced, AggregateType: "order",
			AggregateID: strconv.Itoa(p) + "-" + strconv.Itoa(n) + "-" + strconv.Itoa(i), JSON: []byte(`{"n":` + strconv.Itoa(n) + `}`)}); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// lockWaits reads the server's count and total time of row-lock waits
// (MariaDB), or -1.
func lockWaits(ctx context.Context, d *Dialect, db *sqlx.DB) (int64, time.Duration) {
	if d != MariaDB {
		return -1, 0
	}
	var waits, ms int64
	if db.QueryRowContext(ctx, `SELECT
  (SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_ROW_LOCK_WAITS'),
  (SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'INNODB_ROW_LOCK_TIME')`).Scan(&waits, &ms) != nil {
		return -1, 0
	}
	return waits, time.Duration(ms) * time.Millisecond
}

// String is the run in one line, for logs.
func (r InstancesResult) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %d instances poll %s: published %d acked %d dups %d, NOT DONE after Close %d (pending %d), Close max %v errors %d",
		r.DB, r.Instances, pollName(r.PollInterval), r.Published, r.Acked, r.Duplicates, r.NotDone, r.Pending, r.CloseMax.Round(time.Millisecond), r.CloseErrors)
	for _, s := range r.Statements {
		fmt.Fprintf(&sb, "; %s n=%d p50 %v p99 %v max %v", s.Name, s.Count, s.P50.Round(10*time.Microsecond), s.P99.Round(10*time.Microsecond), s.Max.Round(time.Millisecond))
	}
	fmt.Fprintf(&sb, "; lock waits %d (%v); pool waits %d (%v); load %s", r.LockWaits, r.LockWaitTime, r.PoolWaits, r.PoolWaitTime.Round(time.Millisecond), r.Load)
	if r.CloseError != "" {
		fmt.Fprintf(&sb, "; close error: %s", r.CloseError)
	}
	return sb.String()
}

// loadAverage returns the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}

// Targets of the many-instances rows (issue 33, defect 4): each engine
// write's p99 at the default poll interval, and nothing acknowledged left
// not DONE after Close.
const InstancesWriteP99 = 100 * time.Millisecond

// WriteInstances writes the section "Many instances" of a report: one
// line per run, header under the title.
func WriteInstances(w io.Writer, rs []InstancesResult, header string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Many instances")
	p("")
	if header != "" {
		p("%s", header)
		p("")
	}
	if len(rs) > 0 {
		r := rs[0]
		p("%d engines in one process, each with a store of its own on one table, sharing a pool of 64 connections; a steady load of %d events/s from 8 producers for %v (half published through a subscribing engine, its hot path; half through an engine without subscriptions, so that the others' claims find them), then every engine closed at once with a 5 s context. Per write kind, the engine's own timing (`Metrics.Statement`) over all engines: p99 (max). **not DONE** = events whose handler returned nil but whose row was not DONE after every Close returned (target 0); **pending** = rows not DONE at all (published late, or handed back). Lock waits: the server's `Innodb_row_lock_waits` over the run (MariaDB). Targets: each write's p99 ≤ %v at the default poll interval; 0 not DONE.",
			r.Instances, r.Rate, r.Duration, InstancesWriteP99)
		p("")
	}
	p("| database | poll | published | acked | dups | claim p99 (max) | DONE p99 (max) | lease renewal p99 (max) | release p99 (max) | lock waits | Close max | Close errors | **not DONE** | pending |")
	p("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	cell := func(s StatementStats) string {
		if s.Count == 0 {
			return "—"
		}
		return fmt.Sprintf("%v (%v)", roundDur(s.P99), roundDur(s.Max))
	}
	for _, r := range rs {
		waits := "—"
		if r.LockWaits >= 0 {
			waits = fmt.Sprintf("%d (%v)", r.LockWaits, r.LockWaitTime)
		}
		p("| %s | %s | %d | %d | %d | %s | %s | %s | %s | %s | %v | %d | **%d** | %d |", r.DB, pollName(r.PollInterval), r.Published, r.Acked, r.Duplicates,
			cell(r.Stat("claim")), cell(r.Stat("mark_done")), cell(r.Stat("extend_leases")), cell(r.Stat("release")), waits,
			r.CloseMax.Round(time.Millisecond), r.CloseErrors, r.NotDone, r.Pending)
	}
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(10 * time.Microsecond)
}
