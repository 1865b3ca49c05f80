package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// task is one event of a batch subscription, with the item it belongs to.
type task struct {
	it    *item
	ev    Event
	probe bool
}

// batcher collects the events of one Batch subscription and calls it with
// up to BatchSize of them at a time, at most Concurrency calls at once.
type batcher struct {
	d   *dispatcher
	s   *subscription
	in  chan task
	wg  sync.WaitGroup
	ctx context.Context

	mu     sync.RWMutex // held for reading by add, for writing by close
	closed bool
}

func newBatcher(d *dispatcher, s *subscription) *batcher {
	return &batcher{d: d, s: s, in: make(chan task, 2*s.BatchSize)}
}

// add queues t; it reports false if ctx ended first, or the batcher was
// closed (by a Close that stopped waiting for the worker calling add).
func (b *batcher) add(ctx context.Context, t task) bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return false
	}
	select {
	case b.in <- t:
		return true
	case <-ctx.Done():
		return false
	}
}

// close ends the input: run flushes what it holds and returns.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.in)
	}
}

// run collects batches until in is closed, then flushes what is left.
func (b *batcher) run(ctx context.Context) {
	b.ctx = ctx
	g := newGatherer(b.in, b.s.BatchSize, b.s.BatchLinger)
	for {
		batch, ok := g.next(nil)
		if !ok {
			break
		}
		b.s.sem <- struct{}{}
		b.wg.Go(func() {
			defer func() { <-b.s.sem }()
			b.deliver(batch)
		})
	}
	b.wg.Wait()
}

func (b *batcher) deliver(batch []task) {
	evs := make([]Event, len(batch))
	for i, t := range batch {
		evs[i] = t.ev
		evs[i].Subscription = b.s.Name
	}
	keys := make([]string, len(batch))
	for i, t := range batch {
		keys[i] = t.it.key()
	}
	start := time.Now()
	ctx, end := b.d.leaseBound(b.ctx, b.s.Timeout, keys...)
	err := errLeaseLost // a lease may have run out already: not called
	if ctx.Err() == nil {
		err = leaseLostOr(ctx, b.d.call(ctx, b.s.Timeout, b.d.interceptDeliver(b.s.Name, evs, func(ctx context.Context) error { return b.s.Batch(ctx, evs) })))
	}
	end()
	took := time.Since(start)
	var be *BatchError
	if errors.As(err, &be) && len(be.Errs) != len(batch) {
		err = fmt.Errorf("outbox: batch handler of %q returned %d outcomes for %d events", b.s.Name, len(be.Errs), len(batch))
		be = nil
	}
	for i, t := range batch {
		e := err
		if be != nil {
			e = be.Errs[i]
		}
		t.it.add(b.d.outcome(b.ctx, b.s, t.it, t.probe, e, took))
		b.d.settle(t.it)
	}
}
