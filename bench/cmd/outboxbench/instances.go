package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/bench/harness"
)

// instancesFlags are the -instances-* flags.
type instancesFlags struct {
	n        int
	polls    string
	rate     int
	duration time.Duration
	repeats  int
	perTx    int
	hotEvery int
}

// runInstances runs the many-instances rows on the given databases, the
// repeats interleaved over databases and poll intervals.
func runInstances(ctx context.Context, dialects []*harness.Dialect, dsnOf func(*harness.Dialect) string, f instancesFlags) []harness.InstancesResult {
	var polls []time.Duration
	for p := range strings.SplitSeq(f.polls, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		d := time.Duration(0)
		if p != "0" {
			var err error
			if d, err = time.ParseDuration(p); err != nil {
				fatal("-instances-polls: %v", err)
			}
		}
		polls = append(polls, d)
	}
	var out []harness.InstancesResult
	for range f.repeats {
		for _, d := range dialects {
			for _, poll := range polls {
				res, err := harness.RunInstances(ctx, d, dsnOf(d), harness.InstancesOptions{
					Instances: f.n, PollInterval: poll, Rate: f.rate, Duration: f.duration, Log: logf,
					PerTx: f.perTx, HotEvery: f.hotEvery,
				})
				if err != nil {
					fatal("%s: many instances: %v", d.Name, err)
				}
				logf("%s", res)
				out = append(out, res)
			}
		}
	}
	return out
}

// onlyInstancesRun runs the many-instances rows alone and splices their
// section into out.
func onlyInstancesRun(ctx context.Context, dialects []*harness.Dialect, dsnOf func(*harness.Dialect) string, out string, f instancesFlags) {
	started, load := time.Now(), loadavg()
	res := runInstances(ctx, dialects, dsnOf, f)
	if out == "" {
		return
	}
	var buf bytes.Buffer
	harness.WriteInstances(&buf, res, fmt.Sprintf("Measured by `make bench-instances` (`outboxbench %s`) on %s, in %s. Load average (1/5/15 min) at start %s, at end %s (2 cores, shared with other work).",
		strings.Join(os.Args[1:], " "), started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), load, loadavg()))
	if err := harness.SpliceSection(out, "## Many instances", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Many instances\" of %s", out)
}
