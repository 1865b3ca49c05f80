package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
)

// TestSmoke runs every system for about a second at concurrency 1, so CI
// proves the benchmark still builds and measures; the numbers themselves
// belong to `make bench`.
func TestSmoke(t *testing.T) {
	for _, name := range []string{"mysql", "postgres"} {
		t.Run(name, func(t *testing.T) { smoke(t, testdb.Open(t, name)) })
	}
}

func smoke(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	for _, sys := range Systems() {
		t.Run(sys.Name(), func(t *testing.T) {
			res, err := RunCell(ctx, db, sys, CellOptions{
				Concurrency: 1, Duration: time.Second,
				DrainTimeout: 30 * time.Second, Stall: 10 * time.Second,
				Prefix: UniquePrefix("smoke"),
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", res)
			if res.Committed == 0 || res.Errors > 0 {
				t.Fatalf("committed %d, errors %d (%s)", res.Committed, res.Errors, res.Note)
			}
			if res.Orders != res.Committed {
				t.Errorf("orders table holds %d rows; producers committed %d", res.Orders, res.Committed)
			}
			if !sys.Delivers() {
				return
			}
			// One producer commits in id order, so even an id cursor
			// delivers everything.
			if res.Lost != 0 || res.Phantoms != 0 {
				t.Errorf("lost %d, phantoms %d", res.Lost, res.Phantoms)
			}
			// txoutbox takes the commit time in the first after-commit
			// hook, before the hot path can hand the event to a worker.
			// (With the poller only, and SkipRecent -1, the poller may
			// claim the row between the server's COMMIT and that hook:
			// a measurement race, not an early delivery.)
			if tx, ok := sys.(*Txoutbox); (ok && tx.HotPath || sys.Name() == HTTPTxoutboxName) && res.Early != 0 {
				t.Errorf("%d deliveries recorded before their commit", res.Early)
			}
			if res.Delivered != res.Committed {
				t.Errorf("delivered %d of %d", res.Delivered, res.Committed)
			}
		})
	}
}

// TestDrainAndReport drains a small backlog through txoutbox and
// Watermill on both databases and renders a report from the results.
func TestDrainAndReport(t *testing.T) {
	rep := &Report{Started: time.Now(), Finished: time.Now(), Repeats: 1, Concurrency: []int{1}}
	for _, name := range []string{"mysql", "postgres"} {
		db := testdb.Open(t, name)
		dr := rep.DB(dialectOf(db).Name)
		drainReport(t, db, dr)
	}
	var buf strings.Builder
	rep.Write(&buf, "txoutbox", "txoutbox")
	for _, want := range []string{"## Targets vs measured", "### MariaDB: backlog drain", "### PostgreSQL: backlog drain", "### MariaDB: memory while draining",
		"| MariaDB: backlog drain 2,000 events, txoutbox default Config ÷ Watermill tuned | ≥ 3× |",
		"| PostgreSQL: backlog drain 2,000 events, txoutbox default Config ÷ Watermill tuned | ≥ 3× |",
		"| MariaDB: hot path commit→listener p50, 16 producers | ≤ 0.1 ms | — | not run |",
		"| PostgreSQL: commit tx/s through Publish in txmw ÷ raw order + minimal outbox row, 1 producer | ≥ 0.90 | 0.95 | met |"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(buf.String())
	}
}

func drainReport(t *testing.T, db *sqlx.DB, dr *DBReport) {
	ctx := context.Background()
	const n = 2000
	ours, err := DrainTxoutbox(ctx, db, DrainOptions{N: n, Timeout: time.Minute, SampleMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	if ours.Delivered != n || ours.DoneRows != n {
		t.Errorf("txoutbox: delivered %d, DONE rows %d; want %d", ours.Delivered, ours.DoneRows, n)
	}
	if dr.Name == MariaDB.Name {
		split, err := DrainTxoutbox(ctx, db, DrainOptions{N: n, Timeout: time.Minute, SplitClaim: true})
		if err != nil {
			t.Fatal(err)
		}
		if split.Delivered != n || split.DoneRows != n {
			t.Errorf("split claim: delivered %d, DONE rows %d; want %d", split.Delivered, split.DoneRows, n)
		}
		dr.Memory = &ours
	}
	tuned, err := DrainTxoutbox(ctx, db, DrainOptions{N: n, Timeout: time.Minute, Tuned: true})
	if err != nil {
		t.Fatal(err)
	}
	if tuned.System != TunedDrainName || tuned.Delivered != n || tuned.DoneRows != n {
		t.Errorf("tuned: %q delivered %d, DONE rows %d; want %q, %d", tuned.System, tuned.Delivered, tuned.DoneRows, TunedDrainName, n)
	}
	theirs, err := DrainWatermill(ctx, db, true, DrainOptions{N: n, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if theirs.Delivered != n {
		t.Errorf("Watermill: delivered %d; want %d", theirs.Delivered, n)
	}
	dr.Drains = []DrainResult{ours, tuned, theirs}
	dr.Cells = []CellResult{{System: RawLimitName, Concurrency: 1, CommitTPS: 100}, {System: "txoutbox", Concurrency: 1, CommitTPS: 95, Delivers: true, DeliveredPS: 95}}
	if s := ConfigSummary(db, false); !strings.Contains(s, "DisableHotPath true") {
		t.Errorf("ConfigSummary(poller only) = %q; want DisableHotPath true in it", s)
	}
}

// TestLoadSmoke runs the load test briefly (two instances behind real
// loopback listeners, a few clients, closed loop and paced) and renders
// its report section, so CI proves it still measures.
func TestLoadSmoke(t *testing.T) {
	db := testdb.MySQL(t)
	ctx := context.Background()
	var runs []LoadResult
	for _, o := range []LoadOptions{{Baseline: true}, {}, {Rate: 100}} {
		o.Clients, o.Duration, o.Instances = 4, time.Second, 2
		res, err := RunLoad(ctx, db, testdb.MySQLDSN(), o)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v", res)
		if res.Requests == 0 || res.Errors > 0 || res.Committed != res.Requests {
			t.Fatalf("%s: %d requests, %d errors, %d committed", res.System, res.Requests, res.Errors, res.Committed)
		}
		if !o.Baseline && (res.Lost != 0 || res.Delivered != res.Committed) {
			t.Fatalf("%s: delivered %d of %d, lost %d", res.System, res.Delivered, res.Committed, res.Lost)
		}
		runs = append(runs, res)
	}
	var sb strings.Builder
	WriteLoad(&sb, runs)
	if !strings.Contains(sb.String(), "paced 100 req/s") || len(LoadTargets(runs)) != 8 {
		t.Fatalf("report:\n%s", sb.String())
	}
}
