// Command partbench measures what MySQL/MariaDB day partitions buy: the
// time to remove a million delivered rows by dropping their partitions
// versus the engine's batched DELETE, the publish latency of a concurrent
// writer during each, and the claim latency with millions of DONE rows in
// the table. make bench-partitions runs it and writes docs/bench/partitions.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/test?parseTime=true&interpolateParams=true", "MariaDB/MySQL DSN")
	rows := flag.Int("rows", 1_000_000, "delivered rows to remove")
	big := flag.Int("claim-rows", 5_000_000, "DONE rows in the table for the claim latency")
	out := flag.String("out", "../docs/bench/partitions.md", "report to write (the default is make bench-partitions's, from bench/)")
	flag.Parse()
	ctx := context.Background()
	db, err := sqlx.Open("mysql", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(16)

	var b strings.Builder
	fmt.Fprintf(&b, "# Partitions: dropping days vs deleting rows\n\nMariaDB on this machine (2 cores), `make bench-partitions` (bench/cmd/partbench), %s.\n\n", time.Now().UTC().Format(time.DateOnly))
	fmt.Fprintf(&b, "## Removing %d delivered rows\n\nA writer publishes one event every 5 ms (one transaction each) during the removal; its commit latency is measured.\n\n", *rows)
	b.WriteString("| method | time | rows/s | publish p50 | publish p99 | publish max | publishes |\n|---|---|---|---|---|---|---|\n")
	for _, partitioned := range []bool{false, true} {
		s := newStore(ctx, db, partitioned)
		fill(ctx, db, s, *rows, 1)
		var took time.Duration
		lat := publishDuring(ctx, db, s, func() {
			start := time.Now()
			if partitioned {
				res, err := s.MaintainPartitions(ctx, sqlstore.PartitionConfig{Ahead: 2, Retention: 24 * time.Hour})
				if err != nil || len(res.Dropped) == 0 {
					log.Fatalf("maintain: %+v %v", res, err)
				}
			} else {
				for {
					n, err := s.Cleanup(ctx, time.Hour, 1000, false)
					if err != nil {
						log.Fatal(err)
					}
					if n == 0 {
						break
					}
				}
			}
			took = time.Since(start)
		})
		left := count(ctx, db, s, "status = 1")
		if left > 0 {
			log.Fatalf("%d delivered rows left", left)
		}
		name := "batched DELETE (Config.Retention, 1000 rows a statement)"
		if partitioned {
			name = "DROP PARTITION (MaintainPartitions)"
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %s | %d |\n", name, took.Round(time.Millisecond), float64(*rows)/took.Seconds(), pct(lat, 50), pct(lat, 99), pct(lat, 100), len(lat))
		log.Printf("%s: %v", name, took)
		drop(ctx, db, s)
	}

	fmt.Fprintf(&b, "\n## Claim latency with DONE rows in the table\n\n100 NEW events due; 200 claims of 100 (released after each).\n\n| DONE rows | claim p50 | claim p99 |\n|---|---|---|\n")
	for _, n := range []int{0, *big} {
		s := newStore(ctx, db, true)
		if n > 0 {
			fill(ctx, db, s, n, 0)
		}
		p50, p99 := claimLatency(ctx, db, s)
		fmt.Fprintf(&b, "| %d | %s | %s |\n", n, p50, p99)
		log.Printf("claim with %d DONE rows: p50 %v p99 %v", n, p50, p99)
		drop(ctx, db, s)
	}
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Print(b.String())
}

func newStore(ctx context.Context, db *sqlx.DB, partitioned bool) *sqlstore.Store {
	s, err := sqlstore.New(db, sqlstore.Options{Table: "partbench_" + strings.ToLower(outbox.NewID()[16:])})
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if partitioned {
		// Start three days back, so the filled days are partitions of their own.
		now := func() time.Time { return time.Now().AddDate(0, 0, -3) }
		if err := s.Partition(ctx, sqlstore.PartitionConfig{Ahead: 5, Now: now}); err != nil {
			log.Fatal(err)
		}
	}
	return s
}

func drop(ctx context.Context, db *sqlx.DB, s *sqlstore.Store) {
	for _, t := range s.Tables() {
		db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
	}
}

// fill inserts n DONE rows created two and three days ago (half each),
// delivered an hour after, in statements of 100k generated rows.
func fill(ctx context.Context, db *sqlx.DB, s *sqlstore.Store, n int, _ int) {
	const chunk = 100_000
	start := time.Now()
	conn, err := db.Connx(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION max_recursive_iterations = 1000000"); err != nil {
		log.Fatal(err)
	}
	for done := 0; done < n; done += chunk {
		k := min(chunk, n-done)
		daysAgo := 3
		if done >= n/2 {
			daysAgo = 2
		}
		q := fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, payload_json, occurred_at, status, available_at, created_at, done_at)
WITH RECURSIVE seq (i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM seq WHERE i < %d)
SELECT CONCAT('fill-%d-', i), 'Filled', '{"n":1}', 1, t, 1, t + INTERVAL 1 HOUR, t, t + INTERVAL 1 HOUR
FROM seq, (SELECT UTC_TIMESTAMP(6) - INTERVAL %d DAY AS t) n`, s.Table(), k, done, daysAgo)
		if _, err := conn.ExecContext(ctx, q); err != nil {
			log.Fatalf("fill: %v", err)
		}
	}
	log.Printf("filled %d rows in %v", n, time.Since(start).Round(time.Millisecond))
}

func count(ctx context.Context, db *sqlx.DB, s *sqlstore.Store, where string) int {
	var n int
	if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+s.Table()+" WHERE "+where); err != nil {
		log.Fatal(err)
	}
	return n
}

// publishDuring publishes one event every 5 ms while f runs and returns
// the commit latencies.
func publishDuring(ctx context.Context, db *sqlx.DB, s *sqlstore.Store, f func()) []time.Duration {
	ob, err := outbox.New(s, outbox.Config{DisableHotPath: true})
	if err != nil {
		log.Fatal(err)
	}
	stop := make(chan struct{})
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			start := time.Now()
			tx, err := outbox.BeginTx(ctx, db.DB, nil)
			if err != nil {
				log.Fatal(err)
			}
			if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Live", JSON: []byte(`{}`)}); err != nil {
				log.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				log.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
	})
	f()
	close(stop)
	wg.Wait()
	return lat
}

func claimLatency(ctx context.Context, db *sqlx.DB, s *sqlstore.Store) (p50, p99 time.Duration) {
	ob, err := outbox.New(s, outbox.Config{DisableHotPath: true})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	for range 100 {
		if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "Due", JSON: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	var lat []time.Duration
	for range 200 {
		start := time.Now()
		rows, err := s.Claim(ctx, driver.ClaimRequest{Owner: "bench", Limit: 100, Lease: time.Minute, SkipRecent: -1})
		lat = append(lat, time.Since(start))
		if err != nil || len(rows) != 100 {
			log.Fatalf("claim: %d rows, %v", len(rows), err)
		}
		ids := make([]string, len(rows))
		for i, r := range rows {
			ids[i] = r.ID
		}
		if err := s.Release(ctx, "bench", ids, 0); err != nil {
			log.Fatal(err)
		}
	}
	return pct(lat, 50), pct(lat, 99)
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return s[i].Round(10 * time.Microsecond)
}
