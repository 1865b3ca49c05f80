package harness

import (
	"slices"
	"sync"
	"time"
)

// schedProbe measures how late a goroutine of this process runs after it
// became runnable, while a workload runs: it sleeps SchedProbeTick in a
// loop and records by how much each sleep overran. Every in-process
// hand-off (the hot path's queue to a delivery worker, a channel to a
// listener) is exposed to the same wait for a CPU, so a commit→handler
// tail near the probe's is the machine's scheduling (on 2 cores shared
// with the database server's processes, the operating system's), not
// the engine's work.
type schedProbe struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	late []time.Duration
}

// SchedProbeTick is the probe's sleep.
const SchedProbeTick = time.Millisecond

func startSchedProbe() *schedProbe {
	p := &schedProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t := time.NewTimer(SchedProbeTick)
		defer t.Stop()
		at := time.Now()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				late := time.Since(at) - SchedProbeTick
				p.mu.Lock()
				p.late = append(p.late, max(0, late))
				p.mu.Unlock()
				at = time.Now()
				t.Reset(SchedProbeTick)
			}
		}
	}()
	return p
}

// finish stops the probe and returns the overruns' p50 and p99.
func (p *schedProbe) finish() (p50, p99 time.Duration) {
	close(p.stop)
	<-p.done
	l := p.late
	if len(l) == 0 {
		return 0, 0
	}
	slices.Sort(l)
	return l[len(l)/2], l[len(l)*99/100]
}
