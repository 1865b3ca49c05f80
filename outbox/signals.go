package outbox

import (
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// signals are how the parts downstream of the feeders (the dispatcher, the
// completer) reach the feeders (the poller, the sequencer): through
// channels the feeders own and read, never a pointer to them, so that the
// pipeline Publish → (hot queue | poller | sequencer) → dispatcher →
// completer has no cycle. Every send is non-blocking: a signal lost to a
// full channel is made up by the next poll.
type signals struct {
	reg      *registrar
	ordered  bool             // the store orders events (driver.OrderedStore)
	nudge    chan<- struct{}  // wakes the poller (capacity 1)
	retryDue chan<- time.Time // due times of retries scheduled here, for the poller
	missed   chan<- struct{}  // a due time was lost to a full retryDue (capacity 1)
	dropped  chan<- string    // events dropped from a full hot queue, for the poller to release
	keys     chan<- named     // keys whose next events may be due, for the sequencer
}

// wakePoll asks the poller to poll now.
func (s *signals) wakePoll() {
	select {
	case s.nudge <- struct{}{}:
	default:
	}
}

// scheduleRetryWake asks the poller to poll when a retry or a delayed
// event falls due. If the poller is behind, it says so (missed): the
// poller then asks the store for the due times it missed.
func (s *signals) scheduleRetryWake(due time.Time) {
	select {
	case s.retryDue <- due:
	default:
		select {
		case s.missed <- struct{}{}:
		default:
		}
	}
}

// drop asks the poller to release the lease of id, an event this
// instance will not deliver now, so that it is due at once; it reports
// false if even that list is full (the lease then runs out by itself).
func (s *signals) drop(id string) bool {
	select {
	case s.dropped <- id:
		return true
	default:
		return false
	}
}

// name asks for the head of key to be claimed. It never blocks.
func (s *signals) name(key string) { s.send(named{key: key}) }

// namePast names key, whose event numbered seq was just written DONE:
// the sequencer claims it unless this instance holds it past seq by then.
func (s *signals) namePast(key string, seq int64) { s.send(named{key: key, past: seq}) }

func (s *signals) send(n named) {
	if !s.ordered || n.key == "" || len(s.reg.load().local) == 0 {
		// An instance with no subscription (one that only publishes)
		// leaves the claim to those that deliver.
		return
	}
	select {
	case s.keys <- n:
	default:
		// The poll finds the key; its next event goes the cold way.
	}
}

// next names the key of an ordered item whose outcome was just recorded:
// its key's next event may be due.
func (s *signals) next(it *item) {
	if !it.env.ordered {
		return
	}
	s.send(named{key: it.env.OrderingKey, ev: driver.KeyDone{EventID: it.env.ID, Key: it.env.OrderingKey, Seq: it.env.seq}, held: it.handedOn && it.sub == nil, quiet: s.quietUntil(it)})
	if it.sub != nil && it.sub.Order != Unordered && !it.handedOn {
		// The subscription's delivery of the key's next event may have
		// waited for this one (ClaimDeliveries): poll now, not after the
		// idle back-off.
		s.wakePoll()
	}
}

// quietUntil returns when the key of it, an event (or one delivery of
// it) whose outcome was just recorded, can next have an event claimed, if
// that is known to be later than now: it is an ordered event that failed
// here with a retry for every subscription there is, each of them
// ordered (so every later event of its key, whatever its type, is behind
// it for every subscription that could take it); then nothing of the key
// can go before the earliest of those retries. Zero otherwise.
func (s *signals) quietUntil(it *item) time.Time {
	if it.env.seq <= 0 {
		return time.Time{}
	}
	reg := s.reg.load()
	if len(reg.remote) > 0 || len(it.results) != len(reg.local) || len(reg.local) == 0 {
		return time.Time{}
	}
	wait := time.Duration(-1)
	for i, r := range it.results {
		if r.kind != resRetry || r.delay <= 0 {
			return time.Time{}
		}
		sub := reg.byName[r.sub]
		if sub == nil || sub.Order == Unordered || slices.ContainsFunc(it.results[:i], func(p result) bool { return p.sub == r.sub }) {
			// (A subscription twice: one result per subscription is
			// what makes len(results) == len(reg.local) mean "every".)
			return time.Time{}
		}
		if wait < 0 || r.delay < wait {
			wait = r.delay
		}
	}
	return time.Now().Add(wait)
}
