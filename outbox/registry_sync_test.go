package outbox_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// heldSync is a store whose next SyncSubscriptions, once armed, reads the
// states and then waits for release before returning them: a refresh
// that read just before a Pause committed and is slow to apply.
type heldSync struct {
	*outboxtest.Store
	arm     chan struct{} // a value arms the next call
	read    chan struct{} // closed when the held call has read
	release chan struct{}
}

func (h *heldSync) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	states, err := h.Store.SyncSubscriptions(ctx, subs)
	select {
	case <-h.arm:
		close(h.read)
		<-h.release
	default:
	}
	return states, err
}

// A Pause (or Resume) holds on the instance that made it even when the
// periodic refresh read the subscriptions before it and applies after it:
// the older states must not undo it until the next refresh.
func TestPauseIsNotUndoneByARefreshThatReadBeforeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &heldSync{Store: outboxtest.NewStore(), arm: make(chan struct{}, 1), read: make(chan struct{}), release: make(chan struct{})}
		ob := startedOutbox(t, st, outbox.Config{PollInterval: time.Second, SkipRecent: -1},
			outbox.Subscription{Name: "mailer", Types: []outbox.EventType{"Signup"}, Handler: func(context.Context, outbox.Event) error { return nil }})
		ctx := context.Background()
		st.arm <- struct{}{}
		time.Sleep(time.Second) // the refresh's tick
		<-st.read               // it has read "mailer: not paused" and waits
		paused := make(chan error, 1)
		go func() { paused <- ob.Pause(ctx, "mailer") }()
		synctest.Wait() // the Pause is committed, and applied or waiting to apply
		close(st.release)
		if err := <-paused; err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, s := range ob.Subscriptions() {
			if s.Name == "mailer" && !s.Paused {
				t.Fatal("mailer is not paused after Pause returned: the refresh that read before the Pause applied its older state after it")
			}
		}
	})
}
