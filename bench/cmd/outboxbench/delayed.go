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

// runDelayed runs the delayed-events row (issue 35) on each database, if
// on.
func runDelayed(ctx context.Context, on bool, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, o harness.DelayedOptions) []harness.DelayedResult {
	var out []harness.DelayedResult
	if !on {
		return nil
	}
	for _, d := range dialects {
		db := open(d)
		res, err := harness.RunDelayed(ctx, d, db, o)
		db.Close()
		if err != nil {
			fatal("%s: delayed events: %v", d.Name, err)
		}
		logf("%s", res)
		out = append(out, res)
	}
	return out
}

// delayedEstimate is the time of the delayed-events rows, if on: per
// database the lead, the window and the setup.
func delayedEstimate(dbs int, on bool, o harness.DelayedOptions) time.Duration {
	if !on {
		return 0
	}
	lead := o.Lead
	if lead == 0 {
		lead = harness.DelayedLead(o.N)
	}
	return time.Duration(dbs) * (lead + o.Window + 10*time.Second)
}

// onlyDelayedRun runs the delayed-events rows alone and splices their
// section, with their targets, into out.
func onlyDelayedRun(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, out string, o harness.DelayedOptions) {
	started, load := time.Now(), loadavg()
	est := delayedEstimate(len(dialects), true, o)
	logf("estimated time: %v (finishes about %s)", est.Round(time.Second), time.Now().Add(est).Format("15:04"))
	var envs []string
	for _, d := range dialects {
		db := open(d)
		for _, e := range dbEnvironment(ctx, d, db) {
			envs = append(envs, d.Name+" "+e[0]+": "+e[1])
		}
		db.Close()
	}
	res := runDelayed(ctx, true, dialects, open, o)
	logf("elapsed %v", time.Since(started).Round(time.Second))
	if out == "" {
		return
	}
	var mach []string
	for _, e := range machine() {
		if !strings.HasPrefix(e[0], "load average") {
			mach = append(mach, e[0]+": "+e[1])
		}
	}
	var buf bytes.Buffer
	harness.WriteDelayed(&buf, res, fmt.Sprintf("Measured by `make bench-delayed` (`outboxbench %s`) on %s, in %s; `make bench` runs the same rows and puts their targets into the table at the top. Load average (1/5/15 min) at start %s, at end %s (2 cores, shared with other work). %s. %s.",
		strings.Join(os.Args[1:], " "), started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), load, loadavg(),
		strings.Join(mach, "; "), strings.Join(envs, "; ")))
	buf.WriteString("\n### Delayed events: targets\n\n| target | wanted | measured | |\n| --- | --- | --- | --- |\n")
	for _, t := range harness.DelayedTargets(res) {
		mark := "met"
		if !t.Met {
			mark = "**missed**"
		}
		fmt.Fprintf(&buf, "| %s | %s | %s | %s |\n", t.What, t.Target, t.Measured, mark)
	}
	if err := harness.SpliceSection(out, "## Delayed events", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Delayed events\" of %s", out)
}
