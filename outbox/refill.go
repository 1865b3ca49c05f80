package outbox

import (
	"context"
	"time"
)

// refillGates claims, within limit, for each limited subscription here
// whose gate is at least half empty, the deliveries it has waiting in the
// table (events deferred while its gate was full), as many as the gate
// has room for; one, the probe, for one whose circuit is due for a probe.
// The poller does so before it claims whole events: while a backlog
// drains, those fill every claim's limit, and the gate would run dry. A
// gate whose claim got all it asked for is owed more: it asks for a poll
// once it is half empty again.
func (p *poller) refillGates(ctx context.Context, reg *registry, limit int, t *pollTally) {
	closed, probing := reg.claimable()
	_, limited := reg.gated(closed)
	_, probes := reg.gated(probing)
	t.refill = true
	defer func() { t.refill = false }()
	for _, s := range append(limited, probes...) {
		most := min(1, limit-t.taken)
		if s.circuit.claim() == claimAll {
			room := s.gate.room()
			if room < cap(s.gate.in)/2 {
				continue // not half empty: it asks for a poll when it is
			}
			most = min(room, limit-t.taken)
		}
		if most <= 0 {
			return
		}
		start := time.Now()
		ds := p.claimDeliveries(ctx, reg, most, []string{s.Name})
		t.deliveries(p, reg, ds, start)
		if len(ds) == most {
			s.gate.owed.Store(true) // more may wait
		}
	}
}
