package outboxtest

import (
	"context"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

var _ driver.OwnerReleaser = (*Store)(nil)

// ReleaseOwner implements driver.OwnerReleaser: it releases the committed
// events and the deliveries owner holds, as Release and ReleaseDeliveries
// with delay 0 do.
func (s *Store) ReleaseOwner(ctx context.Context, owner string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for id := range s.events {
		if e := s.held(owner, id); e != nil {
			e.owner, e.lockedUntil = "", time.Time{}
			n++
		}
	}
	for id, subs := range s.deliv {
		for sub := range subs {
			if d := s.heldDelivery(owner, driver.DeliveryID{EventID: id, Subscription: sub}); d != nil {
				d.owner, d.lockedUntil = "", time.Time{}
				n++
			}
		}
	}
	if n > 0 {
		s.touch()
	}
	return n, nil
}
