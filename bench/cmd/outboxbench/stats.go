package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/bench/harness"
)

// runStats runs the statistics rows (issue 34) on the given databases,
// the repeats interleaved over databases (and within each, stale and
// fresh in alternating order).
func runStats(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, n int64, repeats int) []harness.StatsResult {
	var out []harness.StatsResult
	for r := range repeats {
		for _, d := range dialects {
			db := open(d)
			res, err := harness.RunStatsDrains(ctx, d, db, n, r, logf)
			db.Close()
			if err != nil {
				fatal("%v", err)
			}
			out = append(out, res...)
		}
	}
	return out
}

// onlyStatsRun runs the statistics rows alone and splices their section
// into out.
func onlyStatsRun(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, out string, n int64, repeats int) {
	started, load := time.Now(), loadavg()
	res := runStats(ctx, dialects, open, n, repeats)
	if out == "" {
		return
	}
	var buf bytes.Buffer
	harness.WriteStatsDrains(&buf, res, fmt.Sprintf("Measured by `make bench-stats` (`outboxbench %s`) on %s, in %s. Load average (1/5/15 min) at start %s, at end %s (2 cores, shared with other work).",
		strings.Join(os.Args[1:], " "), started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), load, loadavg()))
	if err := harness.SpliceSection(out, "## Backlog drain and table statistics", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Backlog drain and table statistics\" of %s", out)
}
