package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The operator's API: what an outboxctl, an admin page or a user's own
// tool reads and repairs. Each method needs the store to implement the
// optional driver interface it names (sqlstore and outboxtest implement
// them all); without it, the method says so.

// Lag returns, for every subscription this instance knows (its own and
// those other instances registered), what it has not delivered yet, and
// for ordered subscriptions how many keys are blocked for them (counted
// up to driver.MaxCountedBlockedKeys). The store must implement
// driver.OperatorStore (sqlstore does).
func (o *Outbox) Lag(ctx context.Context) ([]Lag, error) {
	os, ok := o.store.(driver.OperatorStore)
	if !ok {
		return nil, fmt.Errorf("outbox: Lag: the store (%T) does not implement driver.OperatorStore", o.store)
	}
	var infos []driver.SubscriptionInfo
	for _, s := range o.Subscriptions() {
		infos = append(infos, driver.SubscriptionInfo{Name: s.Name, Types: typeNames(s.Types)})
	}
	lags, err := os.Lag(ctx, infos)
	if err != nil {
		return lags, err
	}
	if err := o.countBlocked(ctx, lags); err != nil && ctx.Err() == nil {
		o.log.Warn("count the blocked keys for the lag; reported as 0", slog.Any("error", err))
	}
	return lags, nil
}

// countBlocked sets each lag's BlockedKeys, counting up to
// driver.MaxCountedBlockedKeys blocked keys.
func (o *Outbox) countBlocked(ctx context.Context, lags []Lag) error {
	f := o.reg.load().orderFilter()
	if _, ok := o.store.(driver.OrderedStore); !ok || len(f.Block) == 0 {
		return nil
	}
	ks, err := o.BlockedKeys(ctx, "", driver.MaxCountedBlockedKeys)
	if err != nil {
		return fmt.Errorf("outbox: Lag: blocked keys: %w", err)
	}
	for i := range lags {
		for _, k := range ks {
			if k.Subscription == lags[i].Subscription || (k.Subscription == "" && f.Blocks(lags[i].Subscription)) {
				lags[i].BlockedKeys++
			}
		}
	}
	return nil
}

// Inspect returns what the store holds of the event id: its row, and each
// subscription's delivery state with the history of its last attempts.
// A delivered event that a store in archive mode moved out of its table
// is looked up in the archive (Record.Archived). An unknown id gives
// ErrNotFound.
func (o *Outbox) Inspect(ctx context.Context, id string) (Record, error) {
	in, ok := o.store.(driver.Inspector)
	if !ok {
		return Record{}, fmt.Errorf("outbox: Inspect: the store (%T) does not implement driver.Inspector", o.store)
	}
	return in.Inspect(ctx, id)
}

// SearchArchive lists the archived events that match q (by id, type or
// aggregate), in id order, up to q.Limit: the delivered events a store in
// archive mode (sqlstore's Options.ArchiveDelivered) moved out of its
// table. Inspect shows one in full. The store must implement
// driver.Archiver (sqlstore does).
func (o *Outbox) SearchArchive(ctx context.Context, q ArchiveQuery) ([]ArchivedEvent, error) {
	a, ok := o.store.(driver.Archiver)
	if !ok {
		return nil, fmt.Errorf("outbox: SearchArchive: the store (%T) keeps no archive: it does not implement driver.Archiver", o.store)
	}
	return a.SearchArchive(ctx, q)
}

// Scheduled lists up to limit events that are not due yet (delayed by
// Envelope.NotBefore, or given back for a while), earliest due first;
// after, zero for the first page, is the last event of the previous page.
func (o *Outbox) Scheduled(ctx context.Context, after ScheduledEvent, limit int) ([]ScheduledEvent, error) {
	sc, ok := o.store.(driver.Scheduler)
	if !ok {
		return nil, fmt.Errorf("outbox: Scheduled: the store (%T) does not implement driver.Scheduler", o.store)
	}
	return sc.Scheduled(ctx, after.Due, after.ID, limit)
}

// Cancel takes back event id before it is due (Envelope.NotBefore): it is
// marked DONE and never delivered. It reports false if the event is due
// already, being delivered, or done; ErrNotFound for an unknown id;
// ErrOrderedNotCancellable for an ordered event (the later events of its
// key wait behind it).
func (o *Outbox) Cancel(ctx context.Context, id string) (bool, error) {
	sc, ok := o.store.(driver.Scheduler)
	if !ok {
		return false, fmt.Errorf("outbox: Cancel: the store (%T) does not implement driver.Scheduler", o.store)
	}
	return sc.Cancel(ctx, id)
}

// Stats counts the events in the table by status, with the age of the
// oldest undelivered one.
func (o *Outbox) Stats(ctx context.Context) (Stats, error) {
	sr, ok := o.store.(driver.StatsReader)
	if !ok {
		return Stats{}, fmt.Errorf("outbox: Stats: the store (%T) does not implement driver.StatsReader", o.store)
	}
	return sr.Stats(ctx)
}

// Dead lists dead deliveries that match f, oldest first, without payloads.
// Page with f.After (the last id of the previous page) and f.Limit.
func (o *Outbox) Dead(ctx context.Context, f DeadFilter) ([]DeadLetter, error) {
	os, err := o.operator("Dead", f)
	if err != nil {
		return nil, err
	}
	return os.FindDead(ctx, f)
}

// Replay makes the dead deliveries that match f due again with a fresh
// count of attempts, in their original publish order, and returns how
// many; with dryRun it only counts them. Only the subscriptions named by
// the dead deliveries run again, never the others. Replaying what is no
// longer dead does nothing, so replaying twice delivers once more, not
// twice. The instance's poller is woken, so the replayed deliveries go
// out at once.
func (o *Outbox) Replay(ctx context.Context, f DeadFilter, dryRun bool) (int, error) {
	os, err := o.operator("Replay", f)
	if err != nil {
		return 0, err
	}
	n, err := os.ReplayDead(ctx, f, dryRun)
	if err == nil && n > 0 && !dryRun {
		o.poller.wake()
	}
	return n, err
}

// MaxFilterIDs is the most ids a DeadFilter may name.
const MaxFilterIDs = 1000

func (o *Outbox) operator(what string, f DeadFilter) (driver.OperatorStore, error) {
	if len(f.IDs) > MaxFilterIDs {
		return nil, fmt.Errorf("outbox: %s: %d ids in the filter; at most %d: split them into several calls", what, len(f.IDs), MaxFilterIDs)
	}
	os, ok := o.store.(driver.OperatorStore)
	if !ok {
		return nil, fmt.Errorf("outbox: %s: the store (%T) does not implement driver.OperatorStore", what, o.store)
	}
	return os, nil
}

// idleTick is how often DeliverOne and Drain look whether what they
// queued has been delivered and recorded.
const idleTick = 2 * time.Millisecond

// DeliverOne claims the next due event or delivery (one this instance has
// a subscription for), delivers it through this instance's workers, and
// returns once its outcome is recorded. It reports whether there was one.
// It is the operator's "consume one" for tools and tests: the outbox must
// be started (Start), and rows younger than Config.SkipRecent are not due
// yet.
func (o *Outbox) DeliverOne(ctx context.Context) (bool, error) {
	n, err := o.pollAndSettle(ctx, 1)
	return n > 0, err
}

// Drain delivers what is due now, batch after batch, and returns how many
// events and deliveries it took once a poll finds nothing more and
// nothing is in flight here. Retries scheduled for later, deliveries
// deferred by an open circuit or a pause, and rows younger than
// Config.SkipRecent are not due and are left. The outbox must be started.
func (o *Outbox) Drain(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := o.pollAndSettle(ctx, o.cfg.PollBatchSize)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

func (o *Outbox) pollAndSettle(ctx context.Context, most int) (int, error) {
	o.mu.RLock()
	started, closed := o.started, o.closed
	o.mu.RUnlock()
	switch {
	case closed:
		return 0, ErrClosed
	case !started:
		return 0, errors.New("outbox: DeliverOne/Drain: the outbox is not started; call Start first (its workers deliver)")
	}
	o.poller.releaseDropped()
	n, _, err := o.poller.poll(ctx, most, o.cfg.SkipRecent)
	if err != nil {
		return n, err
	}
	t := time.NewTicker(idleTick)
	defer t.Stop()
	for !o.disp.idle() {
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-t.C:
		}
	}
	return n, nil
}
