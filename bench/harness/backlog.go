package harness

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"golang.org/x/sync/errgroup"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// DrainResult is one drain of a prefilled backlog.
type DrainResult struct {
	System     string
	N          int64
	Prefill    time.Duration
	Took       time.Duration // from start of the consumer to the last first delivery
	Rate       float64       // events/s
	Delivered  int64
	Duplicates int64
	DoneRows   int64 // txoutbox: rows DONE in the table after Close
	Mem        []MemSample
	Note       string
}

// MemSample is the process's memory at one moment of a drain.
type MemSample struct {
	At        time.Duration
	Delivered int64
	HeapAlloc uint64
	HeapInuse uint64
	GoSys     uint64
	RSS       uint64
}

// prefillOutbox writes n due events (numbered first…) straight into a
// txoutbox table with multi-row INSERTs, as a backlog left by an outage:
// written a minute ago, not leased.
func prefillOutbox(ctx context.Context, db *sqlx.DB, table string, first, n int64) error {
	return prefillTyped(ctx, db, table, OrderPlaced, first, n)
}

// prefillTyped is prefillOutbox with events of type typ.
func prefillTyped(ctx context.Context, db *sqlx.DB, table string, typ outbox.EventType, first, n int64) error {
	const batch = 1000
	ago := dialectOf(db).Ago
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for lo := first; lo < first+n; lo += batch {
		hi := min(lo+batch, first+n)
		ids := make([]string, 0, hi-lo)
		for range hi - lo {
			ids = append(ids, outbox.NewID())
		}
		g.Go(func() error {
			var sb strings.Builder
			sb.WriteString(`INSERT INTO ` + table + ` (id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at) VALUES `)
			args := make([]any, 0, 3*(hi-lo))
			for i := lo; i < hi; i++ {
				if i > lo {
					sb.WriteString(",")
				}
				sb.WriteString(`(?, ?, 'order', ?, '', NULL, ?, TRUE, ` + ago + `, 0, 0, ` + ago + `, ` + ago + `)`)
				args = append(args, ids[i-lo], string(typ), strconv.FormatInt(i, 10), Payload(i))
			}
			_, err := db.ExecContext(ctx, db.Rebind(sb.String()), args...)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("harness: prefill: %w", err)
	}
	return nil
}

// RawUpdateRate measures the database limit for completing events: n
// prefilled rows marked DONE with sqlstore's MarkDone statement, batch ids
// per UPDATE, by one client. It returns rows/s.
func RawUpdateRate(ctx context.Context, db *sqlx.DB, n int64, batch int) (float64, error) {
	db.SetMaxOpenConns(8)
	prefix := UniquePrefix("upd")
	st, err := newStore(ctx, db, prefix+"_ob")
	if err != nil {
		return 0, err
	}
	defer dropTables(ctx, db, storeTables(st)...)
	if err := prefillOutbox(ctx, db, st.Table(), 0, n); err != nil {
		return 0, err
	}
	var ids []string
	if err := db.SelectContext(ctx, &ids, "SELECT id FROM "+st.Table()+" ORDER BY id"); err != nil {
		return 0, err
	}
	d := dialectOf(db)
	if _, err := db.ExecContext(ctx, "UPDATE "+st.Table()+" SET locked_by = 'raw', locked_until = "+d.NowPlusHour); err != nil {
		return 0, err
	}
	start := time.Now()
	for lo := 0; lo < len(ids); lo += batch {
		chunk := ids[lo:min(lo+batch, len(ids))]
		q := db.Rebind(`UPDATE ` + st.Table() + ` SET status = 1, done_at = ` + d.Now + `, locked_by = NULL, locked_until = NULL
WHERE locked_by = ? AND status IN (0, 2) AND id IN (` + strings.TrimSuffix(strings.Repeat("?, ", len(chunk)), ", ") + `)`)
		args := []any{"raw"}
		for _, id := range chunk {
			args = append(args, id)
		}
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			return 0, err
		}
	}
	return float64(len(ids)) / time.Since(start).Seconds(), nil
}

// DrainOptions tune a backlog drain.
type DrainOptions struct {
	N       int64
	Timeout time.Duration
	// SampleMemory samples the heap and RSS every 250 ms.
	SampleMemory bool
	// Log receives progress lines; nil for none.
	Log func(format string, args ...any)
	// Stall ends a txoutbox drain when nothing is delivered for this long
	// (longer than PollMaxInterval, so an idle poller is not mistaken for
	// a stuck one). Defaults to 20s.
	Stall time.Duration
	// SplitClaim runs the drain with the experimental claim of
	// splitClaimStore (profiling only).
	SplitClaim bool
	// Kick drives the poller from outside with ob.Poll whenever the cold
	// queue has room: a workaround for a poll loop that stops polling.
	Kick bool
	// Destination, if positive, makes the subscription a fake destination
	// that takes this long per call: per event, or, with Batch, per batch
	// of up to 500 (4 calls at once).
	Destination time.Duration
	Batch       bool
	// Tuned drains with the settings of Watermill's tuned forwarder:
	// batches of 1000 and a 10 ms poll interval (and a cold queue that
	// holds two batches).
	Tuned bool
	// Stats, if set, turns the server's automatic statistics off for the
	// drain's tables before the prefill (PostgreSQL autovacuum, InnoDB
	// STATS_AUTO_RECALC), gathers them on the empty table, and then:
	// StatsStale leaves them so (the backlog built up since, as after an
	// outage); StatsFresh gathers them again after the prefill.
	Stats string
}

// The statistics of a drain (DrainOptions.Stats).
const (
	StatsStale = "stale"
	StatsFresh = "fresh"
)

// DrainTxoutbox prefills a txoutbox table with o.N events and measures
// how fast the poller (default Config) delivers them.
func DrainTxoutbox(ctx context.Context, db *sqlx.DB, o DrainOptions) (res DrainResult, err error) {
	res = DrainResult{System: EngineDrainName, N: o.N}
	if o.Kick {
		res.System = KickedDrainName
	}
	if o.SplitClaim {
		res.System = SplitClaimDrainName
	}
	cfg := outbox.Config{Logger: quietLogger()}
	if o.Tuned {
		res.System = TunedDrainName
		cfg.PollBatchSize, cfg.ColdQueueSize, cfg.PollInterval = 1000, 2000, 10*time.Millisecond
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	prefix := UniquePrefix("drain")
	st, err := newStore(ctx, db, prefix+"_ob")
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, dropTables(ctx, db, storeTables(st)...)) }()
	if o.Stats != "" {
		if err := manualStats(ctx, db, st); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	if err := prefillOutbox(ctx, db, st.Table(), 0, o.N); err != nil {
		return res, err
	}
	res.Prefill = time.Since(t0)
	if o.Stats != "" {
		// One full read of the table in both, so that the fresh drain's
		// ANALYZE, which reads it too (and on PostgreSQL sets the hint
		// bits of every new tuple it sees), does not warm its table alone.
		var n int64
		if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+st.Table()); err != nil {
			return res, err
		}
	}
	if o.Stats == StatsFresh {
		if err := analyze(ctx, db, st.Table()); err != nil {
			return res, err
		}
	}
	logf(o.Log, "prefilled %d events in %v", o.N, res.Prefill.Round(time.Millisecond))
	rec := NewRecorder(int(o.N))
	var m Counters
	var store driver.Store = st
	if o.SplitClaim {
		store = &splitClaimStore{Store: st, db: db}
	}
	cfg.Metrics = &m
	ob, err := outbox.New(store, cfg)
	if err != nil {
		return res, err
	}
	sub := outbox.Subscription{Name: "bench", Types: []outbox.EventType{OrderPlaced},
		Handler: func(_ context.Context, ev outbox.Event) error {
			time.Sleep(o.Destination)
			rec.Delivered(seqOf(ev.AggregateID))
			return nil
		}}
	if o.Destination > 0 {
		res.System = PerEventSubName
		if o.Batch {
			res.System = BatchSubName
			sub.Handler, sub.BatchSize, sub.Concurrency = nil, 500, 4
			sub.Batch = func(_ context.Context, evs []outbox.Event) error {
				time.Sleep(o.Destination)
				for _, ev := range evs {
					rec.Delivered(seqOf(ev.AggregateID))
				}
				return nil
			}
		}
	}
	if err := ob.Subscribe(sub); err != nil {
		return res, err
	}

	stopSampling := startSampling(o.SampleMemory, rec, &res.Mem)
	start := rec.Since()
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return res, err
	}
	stopKick := func() {}
	if o.Kick {
		stopKick = kick(ctx, ob)
	}
	waitDelivered(ctx, rec, o.N, o.Timeout, cmp.Or(o.Stall, 20*time.Second))
	stopKick()
	stopSampling()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	err = ob.Close(cctx)
	cancel()
	if err != nil {
		return res, err
	}
	res.finish(rec, start)
	if err := db.GetContext(ctx, &res.DoneRows, "SELECT COUNT(*) FROM "+st.Table()+" WHERE status = 1"); err != nil {
		return res, err
	}
	return res, nil
}

// DrainWatermill prefills Watermill's forwarder table with o.N events and
// measures how fast its forwarder delivers them.
func DrainWatermill(ctx context.Context, db *sqlx.DB, tuned bool, o DrainOptions) (res DrainResult, err error) {
	sys := &Watermill{Tuned: tuned}
	res = DrainResult{System: sys.Name(), N: o.N}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	rec := NewRecorder(int(o.N))
	env := &Env{DB: db, Rec: rec, Prefix: UniquePrefix("wdrain")}
	defer func() { err = errors.Join(err, sys.Teardown(ctx)) }()
	if err := sys.prepare(ctx, env); err != nil {
		return res, err
	}
	t0 := time.Now()
	if err := sys.prefill(0, o.N, 500); err != nil {
		return res, err
	}
	res.Prefill = time.Since(t0)
	logf(o.Log, "prefilled %d events in %v", o.N, res.Prefill.Round(time.Millisecond))
	stopSampling := startSampling(o.SampleMemory, rec, &res.Mem)
	start := rec.Since()
	if err := sys.start(ctx); err != nil {
		return res, err
	}
	waitDelivered(ctx, rec, o.N, o.Timeout, 5*time.Second)
	stopSampling()
	res.finish(rec, start)
	return res, nil
}

// kick calls ob.Poll whenever the cold queue has room for a batch, until
// the returned stop is called.
func kick(ctx context.Context, ob *outbox.Outbox) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	cfg := ob.Config()
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, cold := ob.QueueDepths(); cfg.ColdQueueSize-cold >= cfg.PollBatchSize {
				if n, err := ob.Poll(ctx); err == nil && n > 0 {
					continue
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	return func() { close(done); wg.Wait() }
}

func (res *DrainResult) finish(rec *Recorder, start time.Duration) {
	res.Delivered = rec.DeliveredCount()
	res.Duplicates = rec.dups.Load()
	res.Took = rec.LastDelivery() - start
	if res.Took > 0 {
		res.Rate = float64(res.Delivered) / res.Took.Seconds()
	}
	if res.Delivered < res.N {
		res.Note = fmt.Sprintf("stalled: %d of %d delivered, then none for the stall timeout", res.Delivered, res.N)
	}
}

// waitDelivered waits until n events are delivered, timeout passes, or
// (if stall > 0) nothing new arrives for stall.
func waitDelivered(ctx context.Context, rec *Recorder, n int64, timeout, stall time.Duration) {
	end := time.Now().Add(timeout)
	last, changed := rec.DeliveredCount(), time.Now()
	for rec.DeliveredCount() < n && time.Now().Before(end) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
		if c := rec.DeliveredCount(); c != last {
			last, changed = c, time.Now()
		} else if stall > 0 && time.Since(changed) > stall {
			return
		}
	}
}

func startSampling(on bool, rec *Recorder, out *[]MemSample) (stop func()) {
	if !on {
		return func() {}
	}
	return sampleEvery(250*time.Millisecond, rec, out)
}

// sampleEvery appends a memory sample to out now, every interval, and
// when the returned stop is called.
func sampleEvery(interval time.Duration, rec *Recorder, out *[]MemSample) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	take := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		*out = append(*out, MemSample{At: rec.Since(), Delivered: rec.DeliveredCount(),
			HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse, GoSys: ms.Sys, RSS: rss()})
	}
	take()
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				take()
				return
			case <-t.C:
				take()
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// rss returns the resident set size of this process from /proc, or 0.
func rss() uint64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func logf(l func(string, ...any), format string, args ...any) {
	if l != nil {
		l(format, args...)
	}
}

// storeTables lists the tables a migrated store has.
func storeTables(st *sqlstore.Store) []string {
	return st.Tables()
}
