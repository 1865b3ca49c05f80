// Command outboxbench runs the comparison of issues 6 and 15 on a local
// MariaDB/MySQL and PostgreSQL (-db mariadb,postgres; -dsn, -pg-dsn) and
// writes BENCHMARKS.md; `make bench` runs it with the defaults. Per
// database: the producer tables (raw order only, order + minimal outbox
// row, order + sqlstore's row, Watermill's forwarder default and tuned,
// txoutbox hot path and poller only), the HTTP rows (chi + txmw against a
// hand-written handler, real loopback HTTP), the batched UPDATE limit and
// the backlog drains; the ordered-subscription rows of issue 13 (16
// producers over 1,000 keys, an Unordered then an Ordered subscription per
// repeat, order violations counted, after their raw SQL limit without and
// with the key-row upsert, whose ratio is the raw floor (-ordered-raw);
// -only-ordered runs them alone and replaces their section of -out:
// `make bench-ordered`); the memory drain
// (MariaDB); the inbox rows of issue 36 (inbox consumers against a
// hand-written consume → BEGIN → dedupe INSERT → effect → COMMIT → ack
// loop on NATS and Kafka, and the cost of a duplicate; -only-inbox runs
// them alone and replaces their section of -out: `make bench-inbox`);
// the delayed-events rows of issue 35 (events with NotBefore spread over
// a window: lateness, delivered rate and heap; -only-delayed runs them
// alone and replaces their section of -out: `make bench-delayed`); then
// the connector table.
//
//	go run ./cmd/outboxbench -out ../BENCHMARKS.md
//
// It creates its own uniquely named tables in each database and drops
// them when each measurement ends. It prints an estimate of its run time
// at the start and the elapsed time at the end. Flags narrow a run for
// investigation: -db, -systems and -concurrency pick cells, -cpuprofile
// profiles them; -load adds the load test (-only-load: `make bench-load`).
//
// The connector table (-only-connectors, `make bench-connectors`) sends
// the same events to NATS JetStream, RabbitMQ, Redis Streams and Kafka
// (an in-process kfake) three ways: the broker's own client, txoutbox with
// the broker's connector, and Watermill's forwarder with Watermill's
// publisher for the broker; it counts the messages on the broker after.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/bench/harness"
	"github.com/txoutbox/txoutbox/outbox"
)

func main() {
	var (
		dsn         = flag.String("dsn", "root@tcp(127.0.0.1:3306)/test?parseTime=true&interpolateParams=true", "go-sql-driver/mysql DSN of the MariaDB/MySQL database to run in")
		pgDSN       = flag.String("pg-dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "pgx DSN of the PostgreSQL database to run in")
		dbs         = flag.String("db", "mariadb,postgres", "databases of the producer, HTTP and drain tables: mariadb, postgres")
		out         = flag.String("out", "BENCHMARKS.md", "report to write; empty: none")
		jsonOut     = flag.String("json", "", "also write the raw results as JSON to this file")
		duration    = flag.Duration("duration", 6*time.Second, "production time per cell")
		repeats     = flag.Int("repeats", 3, "repeats of every cell")
		concurrency = flag.String("concurrency", "1,4,16,64", "producer (and HTTP client) counts")
		systems     = flag.String("systems", "", "comma-separated substrings; run only matching systems (the raw references always run)")
		backlog     = flag.String("backlog", "20000,200000", "backlog sizes to drain")
		largeReps   = flag.Int("backlog-large-repeats", 3, "repeats of backlogs above 50k events (Watermill drains them slowly)")
		memN        = flag.Int64("memory", 1_000_000, "events drained while sampling memory (MariaDB); 0: skip")
		cpuprofile  = flag.String("cpuprofile", "", "write a CPU profile of the producer workload to this file")
		mutexprof   = flag.String("mutexprofile", "", "write a mutex profile of the producer workload to this file")
		child       = flag.String("child", "", "internal: run one measurement in a child process")
		experiments = flag.Bool("experiments", false, "add the experiments: completion (MarkDone delayed 10ms, as DELETE, skipped) on the hot path, and a drain with the claim split into NEW and RETRY SELECTs (MariaDB)")
		loadOn      = flag.Bool("load", false, "also run the load test: 64 HTTP clients, two instances, MariaDB (see -load-*; make bench-load runs it alone)")
		onlyLoad    = flag.Bool("only-load", false, "run the load test only")
		loadDur     = flag.Duration("load-duration", 20*time.Second, "duration of each load run")
		loadClients = flag.Int("load-clients", 64, "HTTP clients of the load test")
		loadRepeats = flag.Int("load-repeats", 3, "repeats of the load test")
		loadRates   = flag.String("load-rates", "0.25,0.5", "paced load runs, as fractions of the baseline's closed-loop throughput")
		kickFlag    = flag.Bool("kick", false, "internal: drive the poller with ob.Poll (workaround for a stalled poll loop)")
		connOn      = flag.Bool("connectors", true, "run the connector table (MariaDB): raw client, txoutbox and Watermill's forwarder to each broker (see -only-connectors, -brokers)")
		onlyConn    = flag.Bool("only-connectors", false, "run the connector table only; the report is the table alone (make bench-connectors writes docs/bench/connectors.md)")
		brokers     = flag.String("brokers", strings.Join(harness.BrokerNames, ","), "brokers of the connector table: nats, amqp, redis, kafka (in-process kfake)")
		connN       = flag.Int("connector-events", 20000, "events per connector measurement")
		natsURL     = flag.String("nats", "nats://127.0.0.1:4222", "NATS (JetStream) URL of the connector table")
		amqpURL     = flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL of the connector table")
		redisAddr   = flag.String("redis", "127.0.0.1:6379", "Redis address of the connector table")
		orderedOn   = flag.Bool("ordered", true, "run the ordered-subscription rows: 16 producers over 1,000 keys, an Unordered and an Ordered subscription in each repeat, after the raw rows of -ordered-raw (see -only-ordered)")
		onlyOrdered = flag.Bool("only-ordered", false, "run the ordered-subscription rows only (-db, -repeats, -duration apply) and replace the section \"Ordered subscriptions\" of -out with them (make bench-ordered)")
		orderedRaw  = flag.Bool("ordered-raw", true, "with the ordered-subscription rows, run their raw SQL limit first in each repeat: the same 16 producers over 1,000 keys in plain SQL, order + minimal outbox row without and with sqlstore's key-row upsert, and report their ratio (the raw floor)")
		orderedInst = flag.Int("ordered-instances", 2, "with the ordered-subscription rows, also run the Ordered row on this many outbox instances sharing the producers (one process, one table); 0 or 1: skip that row")
		orderedKeys = flag.Int("ordered-keys", harness.OrderedKeys, "diagnosis: ordering keys of the ordered rows instead of 1,000 (a number far above the events of a run makes nearly every event its key's first)")
		orderedPoll = flag.Duration("ordered-poll", 0, "diagnosis: PollInterval (and PollMaxInterval) of the ordered rows instead of the default Config")
		orderedProf = flag.String("ordered-cpuprofile", "", "write CPU profiles of the first repeat's ordered-subscription rows to PREFIX.<db>.<order>.pprof")
		statsOn     = flag.Bool("stats", true, "run the statistics rows: a drain of -stats-events on a table whose statistics were gathered before the backlog built up, against one with fresh statistics (see -only-stats)")
		onlyStats   = flag.Bool("only-stats", false, "run the statistics rows only (-db, -repeats apply) and replace the section \"Backlog drain and table statistics\" of -out with them (make bench-stats)")
		statsN      = flag.Int64("stats-events", 200_000, "events of each drain of the statistics rows")
		rateOn      = flag.Bool("rate", true, "run the rate-limit rows: a subscription limited to 500 events/s with a backlog, and a drain beside it against the same drain alone (see -only-rate)")
		onlyRate    = flag.Bool("only-rate", false, "run the rate-limit rows only (-db, -repeats apply) and replace the section \"Rate limit\" of -out with them (make bench-rate)")
		rateDrain   = flag.Int64("rate-drain", 50_000, "backlog of the unlimited subscription in the rate-limit rows")
		rateWindow  = flag.Duration("rate-window", 20*time.Second, "how long the limited subscription's rate is measured in the rate-limit rows")
		instOn      = flag.Bool("instances", true, "run the many-instances rows: -instances-n engines on one table under a steady load, at each poll interval of -instances-polls, then Close with 5 s (see -only-instances)")
		onlyInst    = flag.Bool("only-instances", false, "run the many-instances rows only (-db, -instances-* apply) and replace the section \"Many instances\" of -out with them (make bench-instances)")
		instN       = flag.Int("instances-n", 50, "engines of the many-instances rows")
		instPolls   = flag.String("instances-polls", "0,50ms", "PollInterval of the many-instances rows; 0 is the default Config")
		instRate    = flag.Int("instances-rate", 500, "publish load of the many-instances rows, events/s")
		instDur     = flag.Duration("instances-duration", 20*time.Second, "load time of each many-instances row before Close")
		instReps    = flag.Int("instances-repeats", 2, "repeats of each many-instances row")
		instPerTx   = flag.Int("instances-per-tx", 1, "diagnosis: events per producer transaction of the many-instances rows")
		inboxOn     = flag.Bool("inbox", true, "run the inbox rows (-db, -repeats apply): inbox consumers against a hand-written consume/BEGIN/dedupe/effect/COMMIT/ack loop on NATS and Kafka (kfake), and the cost of a duplicate (see -only-inbox)")
		onlyInbox   = flag.Bool("only-inbox", false, "run the inbox rows only and replace the section \"Inbox\" of -out with them (make bench-inbox)")
		inboxN      = flag.Int("inbox-messages", 5000, "messages per inbox consumption cell")
		inboxConc   = flag.Int("inbox-concurrency", 4, "messages (NATS) or partitions (Kafka) handled at once in the inbox rows")
		inboxDups   = flag.Int("inbox-dups", 2000, "Handle calls per duplicate-cost cell of the inbox rows")
		inboxBrk    = flag.String("inbox-brokers", "nats,kafka", "brokers of the inbox rows: nats, kafka (in-process kfake)")
		delayedOn   = flag.Bool("delayed", true, "run the delayed-events rows: -delayed-events events with NotBefore spread evenly over -delayed-window, delivered by one engine; their lateness, delivered rate and heap (see -only-delayed)")
		onlyDelayed = flag.Bool("only-delayed", false, "run the delayed-events rows only (-db, -delayed-* apply) and replace the section \"Delayed events\" of -out with them (make bench-delayed)")
		delayedN    = flag.Int64("delayed-events", 1_000_000, "events of the delayed-events rows")
		delayedWin  = flag.Duration("delayed-window", 10*time.Minute, "span of the delayed events' NotBefore times")
		delayedLead = flag.Duration("delayed-lead", 0, "time from the start of the publishing to the first NotBefore; 0: 10 s + the events at 4,000/s (the publishing should end before the first is due)")
		delayedProd = flag.Int("delayed-producers", 8, "producers of the delayed-events rows")
		delayedTx   = flag.Int("delayed-per-tx", 100, "events per producer transaction (one PublishAll) of the delayed-events rows")
		instHot     = flag.Int("instances-hot-every", 2, "diagnosis: every n-th transaction of the many-instances rows publishes through a subscribing engine (hot path), the others through one without subscriptions; -1: none")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var dialects []*harness.Dialect
	for k := range strings.SplitSeq(*dbs, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		d, err := harness.DialectByKey(k)
		if err != nil {
			fatal("-db: %v", err)
		}
		dialects = append(dialects, d)
	}
	dsnOf := func(d *harness.Dialect) string {
		if d == harness.PostgreSQL {
			return *pgDSN
		}
		return *dsn
	}
	open := func(d *harness.Dialect) *sqlx.DB {
		db, err := sqlx.Open(d.Driver, dsnOf(d))
		if err == nil {
			err = db.PingContext(ctx)
		}
		if err != nil {
			flagName := "-dsn"
			if d == harness.PostgreSQL {
				flagName = "-pg-dsn"
			}
			fatal("cannot reach %s (%v); start it, pass %s, or leave it out of -db", d.Name, err, flagName)
		}
		return db
	}

	if *child == "memory" {
		db := open(harness.MariaDB)
		defer db.Close()
		res, err := harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: *memN, Timeout: 15 * time.Minute, SampleMemory: true, Log: logf, Kick: *kickFlag})
		if err != nil {
			fatal("memory drain: %v", err)
		}
		if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
			fatal("%v", err)
		}
		return
	}

	connectors := func(db *sqlx.DB) *harness.ConnReport {
		cr := &harness.ConnReport{
			Command: "outboxbench " + strings.Join(os.Args[1:], " "),
			Started: time.Now(),
			Options: harness.ConnOptions{
				Brokers: strings.Split(*brokers, ","),
				Addrs:   harness.BrokerAddrs{NATS: *natsURL, AMQP: *amqpURL, Redis: *redisAddr},
				N:       *connN,
				Log:     logf,
			},
		}
		cr.Options.Defaults()
		res, err := harness.RunConnectors(ctx, db, cr.Options)
		if err != nil {
			fatal("connectors: %v", err)
		}
		cr.Results, cr.Ended = res, time.Now()
		cr.Notes = harness.ConnNotes()
		return cr
	}
	if *onlyConn {
		db := open(harness.MariaDB)
		defer db.Close()
		env := append(machine(), dbEnvironment(ctx, harness.MariaDB, db)...)
		cr := connectors(db)
		cr.StandaloneHeader = true
		cr.Environment = append(env, [2]string{"load average at end (1/5/15 min)", loadavg()})
		write(*out, cr.Write)
		return
	}

	concs, err := ints(*concurrency)
	if err != nil {
		fatal("-concurrency: %v", err)
	}
	sizes, err := ints(*backlog)
	if err != nil {
		fatal("-backlog: %v", err)
	}
	if *onlyLoad {
		dialects, concs, sizes, *memN, *connOn, *orderedOn, *instOn, *statsOn, *rateOn, *delayedOn = nil, nil, nil, 0, false, false, false, false, false, false
	}
	harness.OrderedPollInterval = *orderedPoll
	harness.OrderedKeys = *orderedKeys
	instOpts := instancesFlags{n: *instN, polls: *instPolls, rate: *instRate, duration: *instDur, repeats: *instReps, perTx: *instPerTx, hotEvery: *instHot}
	if *onlyInst {
		onlyInstancesRun(ctx, dialects, dsnOf, *out, instOpts)
		return
	}
	inboxOpts := harness.InboxOptions{Brokers: strings.Split(*inboxBrk, ","), Addrs: harness.BrokerAddrs{NATS: *natsURL},
		N: *inboxN, Concurrency: *inboxConc, Repeats: *repeats, Dups: *inboxDups, Log: logf}
	if *onlyInbox {
		onlyInboxRun(ctx, dialects, open, *out, inboxOpts)
		return
	}
	rateOpts := harness.RateOptions{Drain: *rateDrain, Window: *rateWindow, Log: logf}
	if *onlyRate {
		onlyRateRun(ctx, dialects, open, *out, *repeats, rateOpts)
		return
	}
	delayedOpts := harness.DelayedOptions{N: *delayedN, Window: *delayedWin, Lead: *delayedLead, Producers: *delayedProd, PerTx: *delayedTx, Log: logf}
	if *onlyDelayed {
		onlyDelayedRun(ctx, dialects, open, *out, delayedOpts)
		return
	}
	if *onlyStats {
		onlyStatsRun(ctx, dialects, open, *out, *statsN, *repeats)
		return
	}
	if *onlyOrdered {
		onlyOrderedRun(ctx, dialects, open, *out, *repeats, *duration, *orderedRaw, *orderedInst, *orderedProf)
		return
	}
	rep := &harness.Report{
		Started:     time.Now(),
		Command:     "outboxbench " + strings.Join(os.Args[1:], " "),
		Duration:    *duration,
		Repeats:     *repeats,
		Concurrency: concs,
		Environment: machine(),
	}
	hot, cold := &harness.Txoutbox{HotPath: true}, &harness.Txoutbox{HotPath: false}

	var chosen []harness.System
	for _, s := range harness.Systems() {
		if s.Name() == harness.RawLimitName || s.Name() == harness.RawSqlstoreName || s.Name() == harness.HTTPBaselineName || matches(s.Name(), *systems) {
			chosen = append(chosen, s)
		}
	}
	if *experiments {
		chosen = append(chosen, &harness.Txoutbox{HotPath: true, DoneDelay: 10 * time.Millisecond}, &harness.Txoutbox{HotPath: true, SkipDone: true})
	}
	withMariaDB := slices.Contains(dialects, harness.MariaDB)
	est := estimate(dialects, *repeats, len(concs), len(chosen), *duration, sizes, *largeReps, matches("Watermill", *systems),
		withMariaDB && *memN > 0, *memN, *connOn, *loadOn || *onlyLoad, *loadRepeats, *loadDur, len(strings.Split(*loadRates, ",")))
	if *statsOn {
		est += time.Duration(len(dialects)**repeats) * 2 * (time.Duration(*statsN/10_000) * time.Second)
	}
	if *instOn {
		est += time.Duration(len(dialects)*len(strings.Split(*instPolls, ","))**instReps) * (*instDur + 10*time.Second)
	}
	est += delayedEstimate(len(dialects), *delayedOn, delayedOpts)
	if *inboxOn {
		est += time.Duration(len(dialects)**repeats) * time.Minute
	}
	if *rateOn {
		est += time.Duration(len(dialects)**repeats) * 3 * (*rateWindow + 10*time.Second)
	}
	if *orderedOn {
		est += orderedEstimate(len(dialects), *repeats, *duration, *orderedRaw, *orderedInst)
	}
	logf("estimated time: %v (finishes about %s)", est.Round(time.Minute), time.Now().Add(est).Format("15:04"))

	if *loadOn || *onlyLoad {
		db := open(harness.MariaDB)
		runLoad(ctx, rep, db, *dsn, *loadRates, *loadRepeats, *loadClients, *loadDur)
		db.Close()
	}

	for _, d := range dialects {
		db := open(d)
		dr := rep.DB(d.Name)
		dr.Environment = dbEnvironment(ctx, d, db)
		dr.UpdateBatch, dr.UpdateRows = 100, 20000
		driver := "go-sql-driver/mysql with interpolateParams=true"
		if d == harness.PostgreSQL {
			driver = "pgx/v5 stdlib"
		}
		dr.Settings = [][2]string{
			{"raw SQL", "`database/sql` transaction, " + driver + "; minimal outbox row and sqlstore's row as described above"},
			{"Watermill forwarder", harness.WatermillSettings(d)},
			{hot.Name(), "outbox.Config{} defaults: " + harness.ConfigSummary(db, true)},
			{cold.Name(), "poller only with a short poll and no SkipRecent: " + harness.ConfigSummary(db, false)},
			{"HTTP", "net/http server + chi on 127.0.0.1:0, keep-alive http.Client; txoutbox: default Config as the hot path row"},
		}
		runDB(ctx, d, db, dr, chosen, concs, sizes, *repeats, *largeReps, *duration, *systems, *experiments, *cpuprofile, *mutexprof)
		if *orderedOn {
			runOrdered(ctx, d, db, dr, *repeats, *duration, *orderedRaw, *orderedInst, *orderedProf)
		}
		if d == harness.MariaDB && *memN > 0 {
			memory(ctx, dr, *dsn, *memN)
		}
		db.Close()
	}

	if *instOn && len(dialects) > 0 {
		rep.Instances = runInstances(ctx, dialects, dsnOf, instOpts)
	}
	if *statsOn && len(dialects) > 0 {
		rep.Stats = runStats(ctx, dialects, open, *statsN, *repeats)
	}
	rep.Delayed = runDelayed(ctx, *delayedOn, dialects, open, delayedOpts)

	if *rateOn && len(dialects) > 0 {
		rep.Rate = runRate(ctx, dialects, open, *repeats, rateOpts)
	}

	if *inboxOn && len(dialects) > 0 {
		rep.Inbox = runInbox(ctx, dialects, open, inboxOpts)
	}

	if *connOn {
		db := open(harness.MariaDB)
		rep.Connectors = connectors(db)
		db.Close()
	}

	rep.Finished = time.Now()
	rep.Environment = append(rep.Environment, [2]string{"load average at end (1/5/15 min)", loadavg()})
	if len(dialects) > 0 {
		rep.Notes = notes(*memN, withMariaDB)
	}
	logf("elapsed %v (estimated %v)", rep.Finished.Sub(rep.Started).Round(time.Second), est.Round(time.Second))
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fatal("%v", err)
		}
	}
	write(*out, func(w io.Writer) { rep.Write(w, hot.Name(), cold.Name()) })
}

// write renders a report into the file out; empty: nowhere.
func write(out string, render func(io.Writer)) {
	if out == "" {
		return
	}
	var buf bytes.Buffer
	render(&buf)
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		fatal("%v", err)
	}
	logf("wrote %s", out)
}

// estimate is how long the run will take on a 2-core machine like the one
// BENCHMARKS.md was measured on: per cell its duration plus setup and the
// wait for the last deliveries (5 s more where Watermill loses events on
// MariaDB); the drains at the rates measured there.
func estimate(dbs []*harness.Dialect, repeats, concs, systems int, cell time.Duration, sizes []int, largeReps int, watermill, mem bool, memN int64, conn, load bool, loadReps int, loadDur time.Duration, loadRates int) time.Duration {
	const overhead = 200 * time.Millisecond // setup, drain wait, teardown of a cell
	rate := func(n int, perSec float64) time.Duration {
		return time.Duration(float64(n) / perSec * float64(time.Second))
	}
	t := time.Duration(len(dbs)*repeats*concs*systems) * (cell + overhead)
	if watermill && slices.Contains(dbs, harness.MariaDB) {
		t += time.Duration(repeats*2*max(0, concs-1)) * 5 * time.Second
	}
	t += time.Duration(len(dbs)*repeats) * 2 * time.Second // batched UPDATE limit
	for _, n := range sizes {
		reps := repeats
		if n > 50_000 {
			reps = largeReps
		}
		// Prefill ~50k rows/s; txoutbox ~18k/s by default and ~30k/s
		// with batches of 1000; Watermill tuned ~14k/s, default ~6k/s.
		per := 2*rate(n, 50_000) + rate(n, 18_000) + rate(n, 30_000)
		if n <= 50_000 {
			per += 2*rate(n, 50_000) + rate(n, 15_000) + rate(n, 3_000) // the 1 ms destinations
		}
		if watermill {
			per += rate(n, 50_000) + rate(n, 14_000)
			if n <= 50_000 {
				per += rate(n, 50_000) + rate(n, 6_000)
			}
		}
		t += time.Duration(len(dbs)*reps) * per
	}
	if mem {
		t += rate(int(memN), 50_000) + rate(int(memN), 16_000)
	}
	if conn {
		t += 2 * time.Minute
	}
	if load {
		t += time.Duration(loadReps*(2+2*loadRates)) * (loadDur + 5*time.Second)
	}
	return t
}

// orderedEstimate is the time of the ordered-subscription rows: two cells
// per repeat and database, two more with the raw rows.
func orderedEstimate(dbs, repeats int, cell time.Duration, raw bool, instances int) time.Duration {
	cells := 2
	if raw {
		cells += 2
	}
	if instances > 1 {
		cells++
	}
	return time.Duration(dbs*repeats*cells) * (cell + time.Second)
}

// runOrdered runs the ordered-subscription rows on one database: in each
// repeat (with raw) the raw cells without and with the key row, then the
// Unordered subscription, then the Ordered one.
func runOrdered(ctx context.Context, d *harness.Dialect, db *sqlx.DB, dr *harness.DBReport, repeats int, duration time.Duration, raw bool, instances int, profPrefix string) {
	for r := range repeats {
		if raw {
			for _, keyRow := range []bool{false, true} {
				res, err := harness.RunOrderedRaw(ctx, db, keyRow, harness.CellOptions{
					Duration:     duration,
					DrainTimeout: 60 * time.Second,
					Stall:        5 * time.Second,
					Prefix:       harness.UniquePrefix("rk"),
				})
				if err != nil {
					fatal("%s: ordered rows, %s: %v", d.Name, res.System, err)
				}
				res.Repeat = r
				logf("%s rep %d, %2d producers, %s: commit %6.0f tx/s (p50 %v p99 %v), errors %d, key rows %d, seq sum %d, CPU %v/tx, DB log %d B/tx %s",
					d.Name, r+1, res.Concurrency, res.System, res.CommitTPS, res.TxP50.Round(time.Microsecond), res.TxP99.Round(time.Microsecond),
					res.Errors, res.KeyRows, res.SeqSum, (res.CPU / time.Duration(max(1, res.Committed))).Round(time.Microsecond), res.LogBytes/max(1, res.Committed), res.Note)
				dr.OrderedRaw = append(dr.OrderedRaw, res)
			}
		}
		cells := []struct {
			o outbox.Order
			n int
		}{{outbox.Unordered, 1}, {outbox.Ordered, 1}}
		if instances > 1 {
			cells = append(cells, struct {
				o outbox.Order
				n int
			}{outbox.Ordered, instances})
		}
		for _, c := range cells {
			o := c.o
			stop := func() {}
			if profPrefix != "" && r == 0 && c.n == 1 {
				stop = profile(fmt.Sprintf("%s.%s.%s.pprof", profPrefix, strings.ToLower(d.Name), o), "")
			}
			res, err := harness.RunOrdered(ctx, db, o, c.n, harness.CellOptions{
				Duration:     duration,
				DrainTimeout: 60 * time.Second,
				Stall:        5 * time.Second,
				Prefix:       harness.UniquePrefix("k"),
			})
			stop()
			if err != nil {
				fatal("%s: ordered rows, %s: %v", d.Name, o, err)
			}
			res.Repeat = r
			logf("%s rep %d, %2d producers, %d keys, %d instance(s), %-9s commit %6.0f tx/s (p50 %v p99 %v), delivered %6.0f/s, e2e p50 %v p99 %v max %v, errors %d, lost %d, dups %d, violations %d, paths hot %d cold %d, %d claims, tail %v, CPU %v/tx, DB log %d B/tx %s",
				d.Name, r+1, res.Concurrency, res.Keys, res.Instances, res.Order, res.CommitTPS, res.TxP50.Round(time.Microsecond), res.TxP99.Round(time.Microsecond),
				res.DeliveredPS, res.LatP50.Round(time.Microsecond), res.LatP99.Round(time.Microsecond), res.LatMax.Round(time.Microsecond),
				res.Errors, res.Lost, res.Duplicates, res.Violations, res.Hot, res.Cold, res.Claims, res.DrainTail.Round(time.Millisecond),
				(res.CPU / time.Duration(max(1, res.Committed))).Round(time.Microsecond), res.LogBytes/max(1, res.Committed), res.Note)
			dr.Ordered = append(dr.Ordered, res)
		}
	}
}

// onlyOrderedRun runs the ordered-subscription rows alone and splices
// their section into out.
func onlyOrderedRun(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, out string, repeats int, duration time.Duration, raw bool, instances int, profPrefix string) {
	rep := &harness.Report{Started: time.Now(), Command: "outboxbench " + strings.Join(os.Args[1:], " "), Duration: duration, Repeats: repeats}
	est := orderedEstimate(len(dialects), repeats, duration, raw, instances)
	logf("estimated time: %v (finishes about %s)", est.Round(time.Second), time.Now().Add(est).Format("15:04"))
	loadStart := loadavg()
	var envs []string
	for _, d := range dialects {
		db := open(d)
		dr := rep.DB(d.Name)
		for _, e := range dbEnvironment(ctx, d, db) {
			envs = append(envs, d.Name+" "+e[0]+": "+e[1])
		}
		runOrdered(ctx, d, db, dr, repeats, duration, raw, instances, profPrefix)
		db.Close()
	}
	rep.Finished = time.Now()
	m := machine()
	var mach []string
	for _, e := range m {
		if !strings.HasPrefix(e[0], "load average") {
			mach = append(mach, e[0]+": "+e[1])
		}
	}
	rep.OrderedHeader = fmt.Sprintf("Measured by `make bench-ordered` (`%s`) on %s, in %s, %d repeat(s) of %v per row; `make bench` runs the same rows and puts their targets into the table at the top. Load average (1/5/15 min) at start %s, at end %s: the machine (2 cores) was shared with other jobs (builds and race tests of other work) during the run, so the figures are noisy. %s. %s.",
		rep.Command, rep.Started.UTC().Format("2006-01-02 15:04 MST"), rep.Finished.Sub(rep.Started).Round(time.Second), repeats, duration,
		loadStart, loadavg(), strings.Join(mach, "; "), strings.Join(envs, "; "))
	logf("elapsed %v", rep.Finished.Sub(rep.Started).Round(time.Second))
	if out == "" {
		return
	}
	var buf bytes.Buffer
	rep.WriteOrdered(&buf)
	if err := harness.SpliceSection(out, "## Ordered subscriptions", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Ordered subscriptions\" of %s", out)
}

// runDB runs the producer and HTTP cells, the batched UPDATE limit and
// the drains on one database.
func runDB(ctx context.Context, d *harness.Dialect, db *sqlx.DB, dr *harness.DBReport, chosen []harness.System, concs, sizes []int, repeats, largeReps int,
	duration time.Duration, systems string, experiments bool, cpuprofile, mutexprof string) {
	for r := range repeats {
		rate, err := harness.RawUpdateRate(ctx, db, dr.UpdateRows, dr.UpdateBatch)
		if err != nil {
			fatal("%s: batched update: %v", d.Name, err)
		}
		logf("%s: batched UPDATE, repeat %d: %.0f rows/s", d.Name, r+1, rate)
		dr.UpdateRates = append(dr.UpdateRates, rate)
	}

	// Producer workload and HTTP rows.
	stopProfile := profile(cpuprofile, mutexprof)
	for r := range repeats {
		for _, conc := range concs {
			for _, proto := range chosen {
				sys := fresh(proto)
				res, err := harness.RunCell(ctx, db, sys, harness.CellOptions{
					Concurrency:  conc,
					Duration:     duration,
					DrainTimeout: 60 * time.Second,
					Stall:        5 * time.Second,
					Prefix:       harness.UniquePrefix("c"),
				})
				if err != nil {
					fatal("%s: %s at %d producers: %v", d.Name, sys.Name(), conc, err)
				}
				res.Repeat = r
				if t, ok := sys.(*harness.Txoutbox); ok {
					h, dd, c := t.M.Paths()
					dc, di, cl := t.M.Statements()
					slowest, slow := t.M.SlowDone()
					res.Note = strings.TrimSpace(res.Note + fmt.Sprintf(" paths: hot %d, hot dropped %d, cold %d; MarkDone %d statements for %d events (%.1f/stmt, %.0f stmt/s, longest %v, %d over 20 ms); %d claims",
						h, dd, c, dc, di, float64(di)/max(1, float64(dc)), float64(dc)/res.Duration.Seconds(), slowest.Round(time.Microsecond), slow, cl))
				}
				logf("%s rep %d, %2d producers, %-45s commit %6.0f tx/s (p50 %v p99 %v), delivered %6.0f/s, e2e p50 %v p99 %v max %v, lost %d, dups %d, tail %v, CPU %v/tx %s",
					d.Name, r+1, conc, sys.Name(), res.CommitTPS, res.TxP50.Round(time.Microsecond), res.TxP99.Round(time.Microsecond),
					res.DeliveredPS, res.LatP50.Round(time.Microsecond), res.LatP99.Round(time.Microsecond), res.LatMax.Round(time.Microsecond),
					res.Lost, res.Duplicates, res.DrainTail.Round(time.Millisecond), (res.CPU / time.Duration(max(1, res.Committed))).Round(time.Microsecond), res.Note)
				if _, ok := sys.(*harness.Txoutbox); ok {
					res.Note = "" // the path split is in the log, not the report's error list
				}
				dr.Cells = append(dr.Cells, res)
			}
		}
	}
	stopProfile()

	// Backlog drains.
	for _, n := range sizes {
		reps := repeats
		if n > 50_000 {
			reps = largeReps
		}
		for r := range reps {
			drains := []func() (harness.DrainResult, error){
				func() (harness.DrainResult, error) {
					return harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute})
				},
				func() (harness.DrainResult, error) {
					return harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute, Tuned: true})
				},
			}
			if experiments && d == harness.MariaDB {
				drains = append(drains, func() (harness.DrainResult, error) {
					return harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute, SplitClaim: true})
				})
			}
			if n <= 50_000 {
				// Subscriptions to a destination that takes 1 ms per call.
				for _, batch := range []bool{true, false} {
					drains = append(drains, func() (harness.DrainResult, error) {
						return harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute, Tuned: true, Destination: time.Millisecond, Batch: batch})
					})
				}
			}
			if matches("Watermill", systems) {
				// The default forwarder only at the small size: the
				// targets compare with the tuned one, and the default
				// drains 200k in ~40 s.
				for _, tuned := range []bool{false, true} {
					if !tuned && n > 50_000 {
						continue
					}
					drains = append(drains, func() (harness.DrainResult, error) {
						return harness.DrainWatermill(ctx, db, tuned, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute})
					})
				}
			}
			for i, drain := range drains {
				res, err := drain()
				if err != nil {
					fatal("%s: drain %d: %v", d.Name, n, err)
				}
				logf("%s: drain %d, repeat %d, %s: %.0f events/s in %v, dups %d, done rows %d %s", d.Name, n, r+1, res.System, res.Rate, res.Took.Round(time.Millisecond), res.Duplicates, res.DoneRows, res.Note)
				dr.Drains = append(dr.Drains, res)
				if i == 0 && res.Delivered < res.N {
					// The engine's poll loop stopped: measure the rest of
					// the engine with the harness calling Poll.
					res, err := harness.DrainTxoutbox(ctx, db, harness.DrainOptions{N: int64(n), Timeout: 10 * time.Minute, Kick: true})
					if err != nil {
						fatal("%s: drain %d: %v", d.Name, n, err)
					}
					logf("%s: drain %d, repeat %d, %s: %.0f events/s in %v, dups %d, done rows %d %s", d.Name, n, r+1, res.System, res.Rate, res.Took.Round(time.Millisecond), res.Duplicates, res.DoneRows, res.Note)
					dr.Drains = append(dr.Drains, res)
				}
			}
		}
	}
}

// memory drains memN events in a fresh child process (so that earlier runs
// do not blur it) while sampling its memory.
func memory(ctx context.Context, dr *harness.DBReport, dsn string, memN int64) {
	m, err := memoryChild(ctx, dsn, memN, false)
	if err != nil {
		fatal("memory drain: %v", err)
	}
	if m.Delivered < m.N {
		logf("memory drain stalled at %d of %d; again with the harness calling Poll", m.Delivered, m.N)
		stalled := m
		if m, err = memoryChild(ctx, dsn, memN, true); err != nil {
			fatal("memory drain: %v", err)
		}
		dr.MemoryNote = fmt.Sprintf("The engine's own poll loop stalled after %s of %s events (see Notes), so this drain ran with the harness calling `ob.Poll` whenever the cold queue had room for a batch.",
			strconv.FormatInt(stalled.Delivered, 10), strconv.FormatInt(stalled.N, 10))
	}
	dr.Memory = m
	logf("memory drain %d: %.0f events/s in %v, %d samples", m.N, m.Rate, m.Took.Round(time.Millisecond), len(m.Mem))
}

// runLoad runs the load test (MariaDB) into rep.Load.
func runLoad(ctx context.Context, rep *harness.Report, db *sqlx.DB, dsn, rates string, repeats, clients int, dur time.Duration) {
	var fracs []float64
	for _, f := range strings.Split(rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 {
			fatal("-load-rates: %q is not a positive fraction", f)
		}
		fracs = append(fracs, v)
	}
	for r := range repeats {
		run := func(o harness.LoadOptions) harness.LoadResult {
			o.Clients, o.Duration, o.Instances, o.Log = clients, dur, 2, logf
			res, err := harness.RunLoad(ctx, db, dsn, o)
			if err != nil {
				fatal("load: %v", err)
			}
			logf("load, repeat %d, %s, rate %.0f: %.0f req/s, p50 %v p99 %v max %v, errors %d, hot %.2f%%, lost %d, dups %d",
				r+1, res.System, res.Rate, res.ReqPerSec, res.P50.Round(time.Microsecond), res.P99.Round(time.Microsecond), res.Max.Round(time.Microsecond),
				res.Errors, 100*res.HotShare(), res.Lost, res.Dups)
			rep.Load = append(rep.Load, res)
			return res
		}
		base := run(harness.LoadOptions{Baseline: true})
		run(harness.LoadOptions{})
		for _, f := range fracs {
			rate := f * base.ReqPerSec
			run(harness.LoadOptions{Baseline: true, Rate: rate})
			run(harness.LoadOptions{Rate: rate})
		}
	}
}

func notes(memN int64, mariadb bool) []string {
	n := []string{
		"The machine is shared: other processes (builds and tests of other work) ran during the measurement; the load averages above show how much. Ranges are wide where that noise hit; medians are the numbers to compare.",
		"The databases run on the same 2 cores as the producers, the HTTP clients and servers and the consumers, so every system's consumer competes with its own producers for CPU; that is the setting the ratios describe. Both servers stay up during the whole run; only one is under load at a time.",
		"On MariaDB, Watermill's forwarder reads with an offset cursor (`offset > last acked`); rows committed out of offset order are skipped for good. That is the cause of its lost events with several producers; its default SERIALIZABLE read also takes shared locks that slow the producers. On PostgreSQL its schema orders by (transaction id, offset) and reads only transactions older than the oldest one still running (`pg_snapshot_xmin`), which closes that gap at the cost of waiting for the slowest open transaction.",
		"The HTTP rows run the clients and the server in the bench process: their CPU per request is the sum of both, the same way for the baseline and txoutbox, so the difference between the two is the engine's (Publish, after-commit hook, dispatch, listener, completion writes).",
		"Watermill's default forwarder drains only the 20k backlog: the targets compare txoutbox with the tuned one, and the default takes ~40 s for 200k events per repeat and database.",
		"txoutbox poller only runs with SkipRecent −1: the poller skips every row younger than SkipRecent (1 s by default), which spares claims of rows a hot path is delivering but, with the hot path off, only delays delivery.",
		"The memory drain's Go heap includes the harness's own per-event record (20 bytes per event, allocated and touched before the first sample).",
	}
	if mariadb && memN < 1_000_000 {
		n = append(n, fmt.Sprintf("The memory drain uses %s events instead of the 1M the issue asks for, to fit `make bench` into ~40 minutes on this 2-core machine: at the drain rates measured above with a 200k backlog, 1M events would take well over 20 minutes. Run `outboxbench -memory 1000000` for the full size.", strconv.FormatInt(memN, 10)))
	}
	return n
}

func memoryChild(ctx context.Context, dsn string, n int64, kick bool) (*harness.DrainResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "-child=memory", "-dsn="+dsn, "-memory="+strconv.FormatInt(n, 10), "-kick="+strconv.FormatBool(kick))
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var res harness.DrainResult
	if err := json.Unmarshal(outb, &res); err != nil {
		return nil, fmt.Errorf("child output: %w", err)
	}
	return &res, nil
}

// fresh returns a new, unstarted copy of a system.
func fresh(s harness.System) harness.System {
	switch s := s.(type) {
	case *harness.Raw:
		return &harness.Raw{Row: s.Row}
	case *harness.Watermill:
		return &harness.Watermill{Tuned: s.Tuned}
	case *harness.Txoutbox:
		return &harness.Txoutbox{HotPath: s.HotPath, Via: s.Via, DoneDelay: s.DoneDelay, SkipDone: s.SkipDone, DeleteDelivered: s.DeleteDelivered, ArchiveDelivered: s.ArchiveDelivered}
	case *harness.HTTP:
		return &harness.HTTP{Baseline: s.Baseline}
	}
	panic(fmt.Sprintf("unknown system %T", s))
}

func matches(name, filter string) bool {
	if filter == "" {
		return true
	}
	for f := range strings.SplitSeq(filter, ",") {
		if f = strings.TrimSpace(f); f != "" && strings.Contains(strings.ToLower(name), strings.ToLower(f)) {
			return true
		}
	}
	return false
}

func profile(cpu, mutex string) func() {
	var stops []func()
	if cpu != "" {
		f, err := os.Create(cpu)
		if err != nil {
			fatal("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal("%v", err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); f.Close() })
	}
	if mutex != "" {
		runtime.SetMutexProfileFraction(5)
		stops = append(stops, func() {
			f, err := os.Create(mutex)
			if err != nil {
				fatal("%v", err)
			}
			defer f.Close()
			_ = pprof.Lookup("mutex").WriteTo(f, 0)
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// machine describes the machine, Go and this checkout.
func machine() [][2]string {
	var env [][2]string
	add := func(k, v string) { env = append(env, [2]string{k, v}) }
	add("CPU", fmt.Sprintf("%s, %d logical CPUs (GOMAXPROCS %d)", cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0)))
	add("memory", memTotal())
	add("kernel", strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")))
	add("Go", runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		var mods []string
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill-sql/v3", "github.com/go-sql-driver/mysql", "github.com/jackc/pgx/v5", "github.com/jmoiron/sqlx":
				mods = append(mods, d.Path+" "+d.Version)
			}
		}
		add("modules", strings.Join(mods, ", "))
	}
	add("txoutbox", gitDescribe())
	add("load average at start (1/5/15 min)", loadavg())
	return env
}

// dbEnvironment describes one database server: version and the settings
// that decide commit cost and isolation.
func dbEnvironment(ctx context.Context, d *harness.Dialect, db *sqlx.DB) [][2]string {
	var version string
	_ = db.GetContext(ctx, &version, "SELECT VERSION()")
	env := [][2]string{{"server", version + " on the same machine, over TCP 127.0.0.1"}}
	var vars []string
	if d == harness.PostgreSQL {
		_ = db.SelectContext(ctx, &vars, `SELECT name || '=' || setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers', 'max_wal_size', 'default_transaction_isolation') ORDER BY name`)
	} else {
		for _, v := range []string{"innodb_flush_log_at_trx_commit", "sync_binlog", "log_bin", "innodb_buffer_pool_size", "innodb_log_file_size", "transaction_isolation", "tx_isolation"} {
			var name, val string
			if err := db.QueryRowxContext(ctx, "SHOW VARIABLES LIKE ?", v).Scan(&name, &val); err == nil {
				vars = append(vars, name+"="+val)
			}
		}
	}
	return append(env, [2]string{"settings", strings.Join(vars, ", ")})
}

func gitDescribe() string {
	dir, _ := os.Getwd()
	rev, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	s := "commit " + strings.TrimSpace(string(rev))
	if st, err := exec.Command("git", "-C", filepath.Dir(dir), "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		s += " with uncommitted changes"
	}
	return s
}

func cpuModel() string {
	for line := range strings.Lines(readFile("/proc/cpuinfo")) {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	for line := range strings.Lines(readFile("/proc/meminfo")) {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return "unknown"
}

func loadavg() string {
	f := strings.Fields(readFile("/proc/loadavg"))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05")+" "+format+"\n", args...)
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "outboxbench: "+format+"\n", args...)
	os.Exit(1)
}
