package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
)

// CellResult is one run of the producer workload on one system at one
// concurrency.
type CellResult struct {
	System      string
	Concurrency int
	Repeat      int           // 0-based repeat the cell belongs to
	Duration    time.Duration // production phase, measured

	Committed int64 // transactions that committed (producers' count)
	Orders    int64 // order rows in the table after the run
	Errors    int64 // failed transactions
	CommitTPS float64
	TxP50     time.Duration
	TxP99     time.Duration

	Delivers    bool
	Delivered   int64 // distinct events that reached the listener
	DeliveredPS float64
	DrainTail   time.Duration // last delivery − end of production
	LatP50      time.Duration
	LatP95      time.Duration
	LatP99      time.Duration
	LatMax      time.Duration
	Lost        int64 // committed orders never delivered
	Duplicates  int64
	Phantoms    int64 // deliveries of events whose order is not in the table
	// CPU is the user+sys CPU time of the whole process (producers,
	// system and consumer; HTTP clients and server for the HTTP systems)
	// during production.
	CPU time.Duration
	// LogBytes is what the database server wrote to its write-ahead log
	// during production (MariaDB's redo, PostgreSQL's WAL; the whole
	// server's, so the run's own if nothing else writes); -1 if it could
	// not be read. Unlike the commit rate it hardly depends on the
	// machine's noise: work a design adds per transaction shows in it.
	LogBytes int64
	// SchedP50 and SchedP99 are how late a goroutine of this process that
	// slept 1 ms ran, during production (see schedProbe): the floor of any
	// in-process hand-off's latency at that moment. 0: not measured.
	SchedP50, SchedP99 time.Duration
	Early              int // deliveries seen before the producer recorded the commit (latency counted as 0); 0 for txoutbox, whose hook takes the time
	Note               string
}

// CellOptions tune one run.
type CellOptions struct {
	Concurrency int
	Duration    time.Duration
	// DrainTimeout bounds the wait for the last deliveries after the
	// producers stop; Stall ends it early when nothing arrives for that
	// long (a system that lost events never catches up).
	DrainTimeout time.Duration
	Stall        time.Duration
	// Prefix names the run's tables; it must be unique.
	Prefix string
	// SchedProbe measures the process's scheduling delay during
	// production (CellResult.SchedP50, SchedP99).
	SchedProbe bool
}

// RunCell runs the producer workload on sys and verifies the deliveries
// against the orders table.
func RunCell(ctx context.Context, db *sqlx.DB, sys System, o CellOptions) (res CellResult, err error) {
	res = CellResult{System: sys.Name(), Concurrency: o.Concurrency, Delivers: sys.Delivers()}
	db.SetMaxOpenConns(o.Concurrency + 8)
	db.SetMaxIdleConns(o.Concurrency + 8)
	// Room for 40k tx/s, far above what one MariaDB on this kind of
	// machine commits durably.
	rec := NewRecorder(int(o.Duration.Seconds()*40000) + 10000)
	d := dialectOf(db)
	env := &Env{DB: db, D: d, Rec: rec, Prefix: o.Prefix, Orders: d.Quote(o.Prefix + "_orders")}
	if err := createOrders(ctx, db, env.Orders); err != nil {
		return res, fmt.Errorf("harness: create orders table: %w", err)
	}
	defer func() {
		err = errors.Join(err, sys.Teardown(ctx), dropTables(ctx, db, env.Orders))
	}()
	if err := sys.Setup(ctx, env); err != nil {
		return res, fmt.Errorf("harness: setup %s: %w", sys.Name(), err)
	}

	// Producers.
	log0 := d.LogPos(ctx, db)
	cpu0 := processCPU()
	var probe *schedProbe
	if o.SchedProbe {
		probe = startSchedProbe()
	}
	start := rec.Since()
	deadline := time.Now().Add(o.Duration)
	var wg sync.WaitGroup
	lats := make([][]time.Duration, o.Concurrency)
	errs := make([]int64, o.Concurrency)
	var firstErr error
	var errOnce sync.Once
	for w := range o.Concurrency {
		wg.Go(func() {
			l := make([]time.Duration, 0, 1<<14)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				seq, ok := rec.Next()
				if !ok {
					break
				}
				t0 := time.Now()
				if err := sys.Tx(ctx, seq, Payload(seq)); err != nil {
					errs[w]++
					errOnce.Do(func() { firstErr = err })
					continue
				}
				l = append(l, time.Since(t0))
			}
			lats[w] = l
		})
	}
	wg.Wait()
	end := rec.Since()
	if probe != nil {
		res.SchedP50, res.SchedP99 = probe.finish()
	}
	res.CPU = processCPU() - cpu0
	res.LogBytes = -1
	if log1 := d.LogPos(ctx, db); log0 >= 0 && log1 >= log0 {
		res.LogBytes = log1 - log0
	}
	res.Duration = end - start
	var all []time.Duration
	for w := range o.Concurrency {
		all = append(all, lats[w]...)
		res.Errors += errs[w]
	}
	slices.Sort(all)
	res.Committed = rec.CommittedCount()
	res.CommitTPS = float64(res.Committed) / res.Duration.Seconds()
	res.TxP50, res.TxP99 = quantile(all, 0.50), quantile(all, 0.99)
	if firstErr != nil {
		res.Note = "first error: " + trim(firstErr.Error())
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}

	// Drain.
	ids, err := orderIDs(ctx, db, env.Orders)
	if err != nil {
		return res, err
	}
	res.Orders = int64(len(ids))
	if !sys.Delivers() {
		return res, nil
	}
	want := res.Orders
	stall := o.Stall
	if q, ok := sys.(quieter); ok {
		stall = max(stall, q.quietPeriod())
	}
	drainEnd := time.Now().Add(max(o.DrainTimeout, 2*stall))
	lastCount, lastChange := rec.DeliveredCount(), time.Now()
	for rec.DeliveredCount() < want && time.Now().Before(drainEnd) && time.Since(lastChange) < stall {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if n := rec.DeliveredCount(); n != lastCount {
			lastCount, lastChange = n, time.Now()
		}
	}
	res.Delivered = rec.DeliveredCount()
	if last := rec.LastDelivery(); last > start {
		res.DeliveredPS = float64(res.Delivered) / (last - start).Seconds()
		res.DrainTail = max(0, last-end)
	}
	lat, early := rec.latencies()
	res.Early = early
	res.LatP50, res.LatP95, res.LatP99 = quantile(lat, 0.50), quantile(lat, 0.95), quantile(lat, 0.99)
	if len(lat) > 0 {
		res.LatMax = lat[len(lat)-1]
	}
	inTable := make(map[int64]bool, len(ids))
	for _, id := range ids {
		inTable[id] = true
		if !rec.wasDelivered(id) {
			res.Lost++
		}
	}
	res.Duplicates = rec.dups.Load()
	n := min(rec.next.Load(), int64(len(rec.count)))
	for i := range n {
		if rec.wasDelivered(i) && !inTable[i] {
			res.Phantoms++
		}
	}
	res.Phantoms += rec.unknown.Load()
	return res, nil
}

// processCPU returns the user+sys CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// quieter is implemented by systems that may legitimately deliver nothing
// for a while (a poller backing off) before the rest arrives: the drain
// waits at least that long before it calls an event lost.
type quieter interface {
	quietPeriod() time.Duration
}

func orderIDs(ctx context.Context, db *sqlx.DB, table string) ([]int64, error) {
	var ids []int64
	if err := db.SelectContext(ctx, &ids, "SELECT id FROM "+table); err != nil {
		return nil, fmt.Errorf("harness: read orders: %w", err)
	}
	return ids, nil
}

func trim(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

// UniquePrefix returns a table-name prefix unique to this process and call.
func UniquePrefix(tag string) string {
	return strings.ToLower("bench_" + tag + "_" + outbox.NewID()[16:])
}
