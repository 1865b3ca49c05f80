package storetest

import (
	"flag"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Run's schedule: with Harness.Serial no two cases hold a store at once;
// without it the cases run in parallel, but the alone ones never beside
// another. Each case's NewStore waits a little for another case to take
// a store beside it, so that cases run at once are seen at once, then
// skips the case.
func TestRunSchedule(t *testing.T) {
	alone := map[string]bool{}
	for _, c := range cases() {
		alone[c.name] = c.alone
	}
	for _, serial := range []bool{true, false} {
		t.Run("Serial="+strconv.FormatBool(serial), func(t *testing.T) {
			var mu sync.Mutex
			inFlight, most := 0, 0
			arrival := make(chan struct{}) // closed, and replaced, when a store is taken
			var beside []string
			Run(t, Harness{Serial: serial, NewStore: func(ct *testing.T) (driver.Store, Beginner) {
				name := strings.TrimPrefix(ct.Name(), t.Name()+"/")
				mu.Lock()
				inFlight++
				most = max(most, inFlight)
				if inFlight > 1 && (serial || alone[name]) {
					beside = append(beside, name)
				}
				close(arrival)
				arrival = make(chan struct{})
				next, alongside := arrival, inFlight > 1
				mu.Unlock()
				ct.Cleanup(func() { mu.Lock(); inFlight--; mu.Unlock() })
				if !alongside {
					select {
					case <-next:
					case <-time.After(20 * time.Millisecond):
					}
				}
				ct.SkipNow()
				return nil, nil
			}})
			t.Cleanup(func() {
				if len(beside) > 0 {
					t.Errorf("cases run beside another (serial %v): %v", serial, beside)
				}
				if p, _ := strconv.Atoi(flag.Lookup("test.parallel").Value.String()); !serial && p > 1 && most < 2 {
					t.Errorf("at most %d case at once with -parallel %d; want the cases in parallel", most, p)
				}
			})
		})
	}
}
