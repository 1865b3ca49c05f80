package harness

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The statistics rows (issue 34): a backlog drain on a table whose
// statistics were gathered before the backlog built up, against the same
// drain with statistics gathered after it. A claim whose plan follows the
// statistics sorted every pending row on PostgreSQL (155 ms per claim with
// 200,000 pending; the drain fell from ~45k to 2.2k events/s).

// StatsDrainRatio is the target: the stale drain's rate over the fresh
// one's in the same repeat, the median over the repeats (as the other
// ratio targets).
const StatsDrainRatio = 0.8

// StatsResult is one drain of the statistics rows.
type StatsResult struct {
	DB     string
	Repeat int
	Stats  string // StatsStale or StatsFresh
	Drain  DrainResult
}

// manualStats turns the server's automatic statistics off for st's tables
// and gathers them once, on the empty tables.
func manualStats(ctx context.Context, db *sqlx.DB, st *sqlstore.Store) error {
	for _, t := range storeTables(st) {
		q := "ALTER TABLE " + t + " STATS_PERSISTENT = 1 STATS_AUTO_RECALC = 0"
		if dialectOf(db) == PostgreSQL {
			q = "ALTER TABLE " + t + " SET (autovacuum_enabled = false)"
		}
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("harness: statistics off: %w", err)
		}
		if err := analyze(ctx, db, t); err != nil {
			return err
		}
	}
	return nil
}

// analyze gathers table's statistics.
func analyze(ctx context.Context, db *sqlx.DB, table string) error {
	q := "ANALYZE TABLE " + table
	if dialectOf(db) == PostgreSQL {
		q = "ANALYZE " + table
	}
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("harness: analyze: %w", err)
	}
	return nil
}

// statsRatios returns, per repeat of db, the stale drain's rate over the
// fresh one's, and the rates of each.
func statsRatios(rs []StatsResult, db string) (ratios, stale, fresh []float64) {
	by := map[int]map[string]float64{}
	var reps []int
	for _, r := range rs {
		if r.DB != db {
			continue
		}
		if by[r.Repeat] == nil {
			by[r.Repeat] = map[string]float64{}
			reps = append(reps, r.Repeat)
		}
		by[r.Repeat][r.Stats] = r.Drain.Rate
	}
	for _, rep := range reps {
		s, sok := by[rep][StatsStale]
		f, fok := by[rep][StatsFresh]
		if sok {
			stale = append(stale, s)
		}
		if fok {
			fresh = append(fresh, f)
		}
		if sok && fok && f > 0 {
			ratios = append(ratios, s/f)
		}
	}
	return ratios, stale, fresh
}

// statsDBs returns the databases of rs in run order.
func statsDBs(rs []StatsResult) []string {
	var dbs []string
	seen := map[string]bool{}
	for _, r := range rs {
		if !seen[r.DB] {
			seen[r.DB] = true
			dbs = append(dbs, r.DB)
		}
	}
	return dbs
}

// StatsTargets are the statistics rows' targets, one per database.
func StatsTargets(rs []StatsResult) []Target {
	var ts []Target
	for _, db := range statsDBs(rs) {
		ratios, stale, fresh := statsRatios(rs, db)
		if len(ratios) == 0 {
			continue
		}
		r := statOf(ratios)
		n := rs[0].Drain.N
		ts = append(ts, target(fmt.Sprintf("%s: backlog drain %s events, statistics from before the backlog ÷ gathered after it (default Config)", db, num(float64(n))),
			fmt.Sprintf("≥ %.1f", StatsDrainRatio),
			fmt.Sprintf("%s (%s vs %s events/s)", r.f(ratio), num(statOf(stale).med), num(statOf(fresh).med)), r.med >= StatsDrainRatio))
	}
	return ts
}

// WriteStatsDrains renders the statistics rows as the section "Backlog
// drain and table statistics"; header, if set, follows its title.
func WriteStatsDrains(w io.Writer, rs []StatsResult, header string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Backlog drain and table statistics")
	p("")
	if header != "" {
		p("%s", header)
		p("")
	}
	p("The backlog drain of the default Config (as in the drain tables above) on a table whose automatic statistics are off (PostgreSQL `autovacuum_enabled = false`, InnoDB `STATS_PERSISTENT = 1 STATS_AUTO_RECALC = 0`) and were gathered once on the empty table: **stale**, the backlog prefilled after that, as after an outage on a table whose statistics say few rows are pending; **fresh**, gathered again after the prefill (`ANALYZE`). In both, one `SELECT COUNT(*)` of the table after the prefill, before the clock starts: `ANALYZE` reads the whole table too, and on PostgreSQL sets the hint bits of the new tuples it sees, which a stale drain's first reads would otherwise pay alone. Repeats interleaved, the order of the two alternating. Target: stale ÷ fresh of the same repeat ≥ %.1f, the median over the repeats (issue 34).", StatsDrainRatio)
	p("")
	p("| database | events | statistics | runs | events/s | time | dups |")
	p("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
	for _, db := range statsDBs(rs) {
		for _, which := range []string{StatsStale, StatsFresh} {
			var rates, took []float64
			var n, dups int64
			for _, r := range rs {
				if r.DB == db && r.Stats == which {
					rates, took = append(rates, r.Drain.Rate), append(took, float64(r.Drain.Took))
					n, dups = r.Drain.N, dups+r.Drain.Duplicates
				}
			}
			if len(rates) == 0 {
				continue
			}
			p("| %s | %s | %s | %d | %s | %s | %d |", db, num(float64(n)), which, len(rates), statOf(rates).f(num), statOf(took).f(dur), dups)
		}
	}
	p("")
	p("| database | stale ÷ fresh, per repeat | median (min–max) | target ≥ %.1f |", StatsDrainRatio)
	p("| --- | --- | --- | --- |")
	for _, db := range statsDBs(rs) {
		ratios, _, _ := statsRatios(rs, db)
		if len(ratios) == 0 {
			continue
		}
		per := ""
		for i, r := range ratios {
			if i > 0 {
				per += ", "
			}
			per += ratio(r)
		}
		st := statOf(ratios)
		mark := "met"
		if st.med < StatsDrainRatio {
			mark = "**missed**"
		}
		p("| %s | %s | %s | %s |", db, per, st.f(ratio), mark)
	}
}

// RunStatsDrains runs the statistics rows on db (of dialect d): per
// repeat a stale and a fresh drain of n events, their order alternating.
func RunStatsDrains(ctx context.Context, d *Dialect, db *sqlx.DB, n int64, repeat int, log func(string, ...any)) ([]StatsResult, error) {
	order := []string{StatsStale, StatsFresh}
	if repeat%2 == 1 {
		order = []string{StatsFresh, StatsStale}
	}
	var out []StatsResult
	for _, which := range order {
		res, err := DrainTxoutbox(ctx, db, DrainOptions{N: n, Timeout: 10 * time.Minute, Stats: which})
		if err != nil {
			return out, fmt.Errorf("%s: statistics %s: %w", d.Name, which, err)
		}
		logf(log, "%s: drain %d, statistics %s, repeat %d: %.0f events/s in %v, dups %d, done rows %d %s", d.Name, n, which, repeat+1, res.Rate, res.Took.Round(time.Millisecond), res.Duplicates, res.DoneRows, res.Note)
		out = append(out, StatsResult{DB: d.Name, Repeat: repeat, Stats: which, Drain: res})
	}
	return out, nil
}
