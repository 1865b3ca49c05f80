package outbox

import (
	"context"
	"log/slog"
	"time"
)

// The completion writer: one goroutine that records delivered events as
// DONE in batches, so that the common case costs one write per batch.

// complete marks delivered events DONE in batches: it takes what the
// workers have finished, waiting up to CompletionLinger for more, up to
// CompletionBatchSize, writes one statement, and repeats.
func (o *Outbox) complete() {
	batch := make([]*item, 0, o.cfg.CompletionBatchSize)
	ids := make([]string, 0, o.cfg.CompletionBatchSize)
	var keys []DeliveryKey
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for it := range o.doneCh {
		batch = append(batch[:0], it)
		var lingered <-chan time.Time // nil: do not wait
		if o.cfg.CompletionLinger > 0 {
			linger.Reset(o.cfg.CompletionLinger)
			lingered = linger.C
		}
	fill:
		for len(batch) < o.cfg.CompletionBatchSize {
			select {
			case it, ok := <-o.doneCh:
				if !ok {
					break fill // closing: write what there is now
				}
				batch = append(batch, it)
				continue
			default:
			}
			if lingered == nil {
				break
			}
			select {
			case it, ok := <-o.doneCh:
				if !ok {
					break fill
				}
				batch = append(batch, it)
			case <-lingered:
				break fill
			}
		}
		linger.Stop()
		ids = ids[:0]
		keys = keys[:0]
		for _, it := range batch {
			if it.sub == nil {
				ids = append(ids, it.env.ID)
			} else {
				keys = append(keys, DeliveryKey{EventID: it.env.ID, Subscription: it.sub.Name})
			}
		}
		if len(ids) > 0 {
			o.markDone(ids)
		}
		if len(keys) > 0 {
			o.completeDeliveries(keys)
		}
		for _, it := range batch {
			o.inflight.release(it.key())
		}
	}
}

func (o *Outbox) completeDeliveries(keys []DeliveryKey) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	n, err := retryStore(ctx, func() (int, error) { return o.dstore.CompleteDeliveries(ctx, o.cfg.InstanceID, keys) })
	if err != nil {
		o.log.Error("mark deliveries done; they will be delivered again", slog.Int("deliveries", len(keys)), slog.Any("error", err))
		return
	}
	if n < len(keys) {
		o.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("deliveries", len(keys)-n))
	}
}

func (o *Outbox) markDone(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	n, err := retryStore(ctx, func() (int, error) { return o.store.MarkDone(ctx, o.cfg.InstanceID, ids) })
	if err != nil {
		// The rows keep their lease and are delivered again once it
		// expires: at least once, never lost.
		o.log.Error("mark events done; they will be delivered again", slog.Int("events", len(ids)), slog.Any("error", err))
		return
	}
	if n < len(ids) {
		o.log.Warn("lease lost on delivered events: another instance owns them", slog.Int("events", len(ids)-n))
	}
}
