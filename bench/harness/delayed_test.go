package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
)

// TestDelayedSmoke schedules a few hundred events over two seconds on
// each database and checks that every one arrives once, none early; the
// lateness figures belong to `make bench-delayed`.
func TestDelayedSmoke(t *testing.T) {
	for _, name := range []string{"mysql", "postgres"} {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			res, err := RunDelayed(context.Background(), dialectOf(db), db, DelayedOptions{N: 300, Window: 2 * time.Second, Lead: 3 * time.Second, Producers: 2, PerTx: 50})
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if res.Delivered != res.N || res.Lost != 0 || res.Duplicates != 0 || res.Early != 0 {
				t.Errorf("delivered %d of %d, lost %d, dups %d, early %d", res.Delivered, res.N, res.Lost, res.Duplicates, res.Early)
			}
			if len(res.LateP99ByTenth) != 10 {
				t.Errorf("p99 of %d tenths; want 10", len(res.LateP99ByTenth))
			}
		})
	}
}

// TestWriteDelayed checks that the section's table rows have as many
// cells as its header.
func TestWriteDelayed(t *testing.T) {
	var buf bytes.Buffer
	WriteDelayed(&buf, []DelayedResult{{DB: "MariaDB", N: 1000, Window: time.Minute, Lead: 10 * time.Second, Publish: time.Second, Published: 1000, Delivered: 1000,
		LateP99ByTenth: make([]time.Duration, 10)}}, "")
	var cells []int
	for line := range strings.Lines(buf.String()) {
		if strings.HasPrefix(line, "|") {
			cells = append(cells, strings.Count(line, "|"))
		}
	}
	if len(cells) != 3 || cells[0] != cells[1] || cells[1] != cells[2] {
		t.Fatalf("table lines with %v cells:\n%s", cells, buf.String())
	}
}
