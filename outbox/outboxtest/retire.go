package outboxtest

import (
	"context"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// RetireSubscription implements driver.Retirer.
func (s *Store) RetireSubscription(ctx context.Context, name string, idle time.Duration) (driver.Retired, error) {
	if err := ctx.Err(); err != nil {
		return driver.Retired{}, err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out driver.Retired
	if m := s.subs[name]; m != nil {
		if ago := now.Sub(m.seen); ago < idle {
			return driver.Retired{}, fmt.Errorf("outboxtest: retire subscription %q: %w: registered %s ago", name, driver.ErrSubscriptionLive, ago)
		}
		delete(s.subs, name)
		s.registry++
		out.Registered = true
	}
	for id, ds := range s.deliv {
		d := ds[name]
		if d == nil || (d.status != outbox.StatusNew && d.status != outbox.StatusRetry) {
			continue
		}
		delete(ds, name)
		out.Dropped++
		if e := s.events[id]; e != nil && e.row.Status == outbox.StatusSplit {
			s.completeSplit(id, now)
			if e.row.Status == outbox.StatusDone {
				out.Completed++
			}
		}
	}
	s.touch()
	return out, nil
}
