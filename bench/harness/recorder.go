package harness

import (
	"slices"
	"sync/atomic"
	"time"
)

// Recorder keeps, for every event of one run, when its transaction
// committed and when (and how often) the listener received it. Events are
// numbered 0…capacity−1 by the producers; the number travels with the
// event (order id, aggregate id or message metadata).
type Recorder struct {
	base    time.Time
	commit  []atomic.Int64 // ns since base; 0 = not committed (yet)
	deliver []atomic.Int64 // ns since base of the first delivery
	count   []atomic.Int32

	next      atomic.Int64 // next sequence number
	committed atomic.Int64
	delivered atomic.Int64 // distinct events delivered
	dups      atomic.Int64 // deliveries beyond the first
	unknown   atomic.Int64 // deliveries of numbers never handed out
	last      atomic.Int64 // ns since base of the latest first delivery
}

// NewRecorder returns a Recorder for at most capacity events. Its memory
// is touched up front, so that the process's RSS does not grow with the
// events recorded during a memory measurement.
func NewRecorder(capacity int) *Recorder {
	r := &Recorder{
		commit:  make([]atomic.Int64, capacity),
		deliver: make([]atomic.Int64, capacity),
		count:   make([]atomic.Int32, capacity),
	}
	for i := range capacity {
		r.commit[i].Store(0)
		r.deliver[i].Store(0)
		r.count[i].Store(0)
	}
	r.base = time.Now()
	return r
}

func (r *Recorder) now() int64 { return max(1, int64(time.Since(r.base))) }

// Next hands out the next event number, or false when capacity is used up.
func (r *Recorder) Next() (int64, bool) {
	n := r.next.Add(1) - 1
	return n, n < int64(len(r.commit))
}

// Committed records that event seq's transaction has committed, now.
func (r *Recorder) Committed(seq int64) {
	r.commit[seq].Store(r.now())
	r.committed.Add(1)
}

// Delivered records that the listener received event seq, now.
func (r *Recorder) Delivered(seq int64) {
	if seq < 0 || seq >= int64(len(r.count)) {
		r.unknown.Add(1)
		return
	}
	t := r.now()
	if r.count[seq].Add(1) == 1 {
		r.deliver[seq].Store(t)
		r.delivered.Add(1)
		for {
			l := r.last.Load()
			if t <= l || r.last.CompareAndSwap(l, t) {
				break
			}
		}
		return
	}
	r.dups.Add(1)
}

// DeliveredCount returns how many distinct events were delivered so far.
func (r *Recorder) DeliveredCount() int64 { return r.delivered.Load() }

// CommittedCount returns how many transactions committed so far.
func (r *Recorder) CommittedCount() int64 { return r.committed.Load() }

// Since returns the time since the recorder's base.
func (r *Recorder) Since() time.Duration { return time.Duration(r.now()) }

// LastDelivery returns the time of the latest first delivery, relative to
// the recorder's base.
func (r *Recorder) LastDelivery() time.Duration { return time.Duration(r.last.Load()) }

// latencies returns commit-to-listener latencies of every event that was
// both committed and delivered, sorted, and the number of events whose
// delivery was recorded before their commit (which a correct hook order
// makes impossible for txoutbox; systems without hooks record the commit
// after COMMIT returns, when a fast poller may already have the event).
func (r *Recorder) latencies() (lat []time.Duration, early int) {
	n := min(r.next.Load(), int64(len(r.commit)))
	lat = make([]time.Duration, 0, n)
	for i := range n {
		c, d := r.commit[i].Load(), r.deliver[i].Load()
		if c == 0 || d == 0 {
			continue
		}
		if d < c {
			early++
			d = c
		}
		lat = append(lat, time.Duration(d-c))
	}
	slices.Sort(lat)
	return lat, early
}

// wasDelivered reports whether event seq reached the listener.
func (r *Recorder) wasDelivered(seq int64) bool {
	return seq >= 0 && seq < int64(len(r.count)) && r.count[seq].Load() > 0
}

// quantile returns the q-quantile (nearest rank) of sorted s, or 0.
func quantile[T ~int64](s []T, q float64) T {
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s)-1) + 0.5)
	return s[min(i, len(s)-1)]
}
