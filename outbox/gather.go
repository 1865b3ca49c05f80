package outbox

import "time"

// gatherer collects items from a channel into batches: after the first
// item it takes whatever else is waiting, then waits up to linger for
// more, up to max items. The completer and the batch subscriptions use
// it.
type gatherer[T any] struct {
	in     <-chan T
	max    int
	linger time.Duration // ≤ 0: do not wait
	// lingerNow, if set, gives the linger instead, asked when a batch's
	// first item has come.
	lingerNow func() time.Duration
	timer     *time.Timer
}

func newGatherer[T any](in <-chan T, max int, linger time.Duration) *gatherer[T] {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &gatherer[T]{in: in, max: max, linger: linger, timer: t}
}

// next returns the next batch, appended to buf[:0], and false once in is
// closed and drained.
func (g *gatherer[T]) next(buf []T) ([]T, bool) {
	first, ok := <-g.in
	if !ok {
		return buf[:0], false
	}
	batch := append(buf[:0], first)
	linger := g.linger
	if g.lingerNow != nil {
		linger = g.lingerNow()
	}
	var lingered <-chan time.Time // nil: do not wait
	if linger > 0 {
		g.timer.Reset(linger)
		lingered = g.timer.C
	}
	defer g.timer.Stop()
	for len(batch) < g.max {
		select {
		case v, ok := <-g.in:
			if !ok {
				return batch, true // closing: this batch now
			}
			batch = append(batch, v)
			continue
		default:
		}
		if lingered == nil {
			return batch, true
		}
		select {
		case v, ok := <-g.in:
			if !ok {
				return batch, true
			}
			batch = append(batch, v)
		case <-lingered:
			return batch, true
		}
	}
	return batch, true
}
