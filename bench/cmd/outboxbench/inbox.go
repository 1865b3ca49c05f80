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

// runInbox runs the inbox rows (issue 36) on the given databases.
func runInbox(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, opts harness.InboxOptions) *harness.InboxReport {
	rep := &harness.InboxReport{}
	for _, d := range dialects {
		db := open(d)
		err := harness.RunInbox(ctx, d, db, rep, opts)
		db.Close()
		if err != nil {
			fatal("%v", err)
		}
	}
	return rep
}

// onlyInboxRun runs the inbox rows alone and splices their section, with
// their targets, into out.
func onlyInboxRun(ctx context.Context, dialects []*harness.Dialect, open func(*harness.Dialect) *sqlx.DB, out string, opts harness.InboxOptions) {
	started, load := time.Now(), loadavg()
	var envs []string
	for _, d := range dialects {
		db := open(d)
		for _, e := range dbEnvironment(ctx, d, db) {
			envs = append(envs, d.Name+" "+e[0]+": "+e[1])
		}
		db.Close()
	}
	rep := runInbox(ctx, dialects, open, opts)
	var mach []string
	for _, e := range machine() {
		if !strings.HasPrefix(e[0], "load average") {
			mach = append(mach, e[0]+": "+e[1])
		}
	}
	rep.Header = fmt.Sprintf("Measured by `make bench-inbox` (`outboxbench %s`) on %s, in %s, %d repeat(s); `make bench` runs the same rows and puts their targets into the table at the top. Load average (1/5/15 min) at start %s, at end %s: the machine (2 cores) was shared with other jobs during the run (a long simulation, niced, and other builds and tests), so the figures are noisy; the ratios come from cells run one after the other in the same repeat. %s. %s.",
		strings.Join(os.Args[1:], " "), started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second), opts.Repeats,
		load, loadavg(), strings.Join(mach, "; "), strings.Join(envs, "; "))
	if out == "" {
		return
	}
	var buf bytes.Buffer
	rep.Write(&buf)
	buf.WriteString("\n### Inbox: targets\n\n| target | wanted | measured | |\n| --- | --- | --- | --- |\n")
	for _, t := range rep.Targets() {
		mark := "met"
		if !t.Met {
			mark = "**missed**"
		}
		fmt.Fprintf(&buf, "| %s | %s | %s | %s |\n", t.What, t.Target, t.Measured, mark)
	}
	if err := harness.SpliceSection(out, "## Inbox", buf.Bytes()); err != nil {
		fatal("%v", err)
	}
	logf("wrote the section \"Inbox\" of %s", out)
}
