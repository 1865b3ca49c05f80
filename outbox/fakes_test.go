package outbox

import (
	"context"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// nopDeliveries is a DeliveryStore with no subscriptions of other
// instances and no deliveries, for the fake stores of the engine's unit
// tests (which never split an event).
type nopDeliveries struct{}

func (nopDeliveries) SyncSubscriptions(context.Context, []driver.SubscriptionInfo) (driver.Registration, error) {
	return driver.Registration{}, nil
}
func (nopDeliveries) SetPaused(context.Context, string, bool) (bool, error) { return false, nil }
func (nopDeliveries) Split(_ context.Context, _ string, splits []driver.EventSplit, _ int64) ([]bool, error) {
	held := make([]bool, len(splits))
	for i := range held {
		held[i] = true
	}
	return held, nil
}
func (nopDeliveries) ClaimDeliveries(context.Context, driver.ClaimRequest, []string, driver.OrderFilter) ([]driver.Delivery, error) {
	return nil, nil
}
func (nopDeliveries) CompleteDeliveries(_ context.Context, _ string, keys []driver.DeliveryID) (int, error) {
	return len(keys), nil
}
func (nopDeliveries) FailDelivery(context.Context, string, driver.DeliveryID, driver.DeliveryWrite) (bool, error) {
	return true, nil
}
func (nopDeliveries) ExtendDeliveryLeases(_ context.Context, _ string, keys []driver.DeliveryID, _ time.Duration) (int, error) {
	return len(keys), nil
}
func (nopDeliveries) ReleaseDeliveries(context.Context, string, []driver.DeliveryID, time.Duration) error {
	return nil
}

func (nopDeliveries) DueNow(context.Context, string) (int, error) { return 0, nil }
