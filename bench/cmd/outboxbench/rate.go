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

// runRate runs the rate-limit rows (issue 35) on the given databases, the
// repeats interleaved over databases.
func runRate(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, repeats int, o harness.RateOptions) []harness.RateResult {
	var out []harness.RateResult
	for r := range repeats {
		for _, d := range dialects {
			db := open(d)
			res, err := harness.RunRateLimit(ctx, d, db, r, o)
			db.Close()
			if err != nil {
				fatal("%v", err)
			}
			out = append(out, res...)
		}
	}
	return out
}

// onlyRateRun runs the rate-limit rows alone and splices their section
// into out.
func onlyRateRun(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, out string, repeats int, o harness.RateOptions) {
	started, load := time.Now(), loadavg()
	res := runRate(ctx, dialects, open, repeats, o)
	if out == "" {
		return
	}
	var buf bytes.Buffer
	harness.WriteRateLimit(&buf, res, fmt.Sprintf("Measured by `make bench-rate` (`outboxbench %s`) on %s, in %s. Load average (1/5/15 min) at start %s, at end %s (2 cores, shared with other work).",
		strings.Join(os.Args[1:], " "), started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), load, loadavg()))
	if err := harness.SpliceSection(out, "## Rate limit", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Rate limit\" of %s", out)
}
