package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// hookedStore wraps a store to observe or disturb single calls, for
// the engine cases that inject a fault between the engine and the store.

// hookedStore wraps a store to observe or disturb single calls. Nil hooks
// pass through.
type hookedStore struct {
	driver.Store
	driver.DeliveryStore
	claim func(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error)
	// claimDeliveries replaces ClaimDeliveries.
	claimDeliveries func(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error)
	// record wraps the writes of failed deliveries (Split and
	// FailDelivery): write performs the real one.
	record func(ctx context.Context, ws []driver.DeliveryWrite, write func() (bool, error)) (bool, error)
}

func hooked(st driver.Store) *hookedStore {
	return &hookedStore{Store: st, DeliveryStore: st.(driver.DeliveryStore)}
}

func (s *hookedStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	if s.claim != nil {
		return s.claim(ctx, req)
	}
	return s.Store.Claim(ctx, req)
}

func (s *hookedStore) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	if s.claimDeliveries != nil {
		return s.claimDeliveries(ctx, req, subs, f)
	}
	return s.DeliveryStore.ClaimDeliveries(ctx, req, subs, f)
}

func (s *hookedStore) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	if s.record == nil || len(splits) != 1 {
		return s.DeliveryStore.Split(ctx, owner, splits, registry)
	}
	held, err := s.record(ctx, splits[0].Writes, func() (bool, error) {
		return splitOne(ctx, s.DeliveryStore, owner, splits[0].EventID, splits[0].Writes, registry)
	})
	if err != nil {
		return nil, err
	}
	return []bool{held}, nil
}

// splitOne is DeliveryStore.Split of one event.
func splitOne(ctx context.Context, ds driver.DeliveryStore, owner, id string, writes []driver.DeliveryWrite, registry int64) (bool, error) {
	held, err := ds.Split(ctx, owner, []driver.EventSplit{{EventID: id, Writes: writes}}, registry)
	if err == nil && len(held) != 1 {
		return false, fmt.Errorf("Split of 1 event returned %d results", len(held))
	}
	return err == nil && held[0], err
}

func (s *hookedStore) FailDelivery(ctx context.Context, owner string, k driver.DeliveryID, w driver.DeliveryWrite) (bool, error) {
	write := func() (bool, error) { return s.DeliveryStore.FailDelivery(ctx, owner, k, w) }
	if s.record != nil {
		return s.record(ctx, []driver.DeliveryWrite{w}, write)
	}
	return write()
}

// ownerReleasing is a hookedStore that keeps the OwnerReleaser of the
// store it wraps (a hookedStore alone hides it: Close then hands back by
// id).
type ownerReleasing struct {
	*hookedStore
	driver.OwnerReleaser
}

// releasingByOwner returns s with the wrapped store's OwnerReleaser, if
// byOwner and it has one, or else s.
func (s *hookedStore) releasingByOwner(byOwner bool) driver.Store {
	if r, ok := s.Store.(driver.OwnerReleaser); ok && byOwner {
		return ownerReleasing{s, r}
	}
	return s
}

// outboxOn is e.outbox over another store (a wrapper of e.store).
func (e *env) outboxOn(t *testing.T, st driver.Store, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	inner := e.store
	e.store = st
	defer func() { e.store = inner }()
	return e.outbox(t, cfg)
}
