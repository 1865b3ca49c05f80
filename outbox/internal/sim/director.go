package sim

import (
	"context"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// direct injects the seed's faults until ctx ends: every so often it
// picks one and applies it.
func (w *world) direct(ctx context.Context) {
	w.faultCtx = ctx
	joined := false
	for {
		t := time.NewTimer(w.dur(200*time.Millisecond, 3*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		w.act(w.intn(100), &joined)
	}
}

// act applies the fault numbered r (0–99), if its class is on.
func (w *world) act(r int, joined *bool) {
	on := w.opts.Faults.on
	switch {
	case r < 10:
		if nd := w.pickLive(2); nd != nil && on("crash") {
			nd.crash()
		}
	case r < 22:
		if nd := w.pickLive(2); nd != nil && on("close") {
			nd.close(w.closeWait())
		}
	case r < 30:
		if nd := w.pickLive(1); nd != nil && on("freeze") {
			nd.freeze(w.dur(w.cfg.Lease/2, 2*w.cfg.Lease))
		}
	case r < 40:
		if !*joined && on("join") {
			*joined = true
			w.join()
		}
	case r < 55:
		w.restartOne()
	case r < 63:
		if on("outage") {
			w.outage()
		}
	case r < 71:
		if on("pause") {
			w.pauseOne(w.faultCtx)
		}
	case r < 80:
		if on("replay") {
			w.replay()
		}
	case r < 86:
		if on("skip") {
			w.skipBlocked()
		}
	}
}

// closeWait is the time a Close gets: none, a little, or enough.
func (w *world) closeWait() time.Duration {
	switch w.intn(4) {
	case 0:
		return 0
	case 1:
		return w.dur(0, 50*time.Millisecond)
	case 2:
		return w.dur(0, 2*time.Second)
	}
	return 10 * time.Second
}

// pickLive returns a live node, if at least minLive are live.
func (w *world) pickLive(minLive int) *node {
	live := w.liveNodes()
	if len(live) < minLive {
		return nil
	}
	return live[w.intn(len(live))]
}

// join starts a node that runs the base set and one subscription more: a
// rolling deploy.
func (w *world) join() {
	extra := extras[w.intn(len(extras))]
	w.mu.Lock()
	w.specs = append(w.specs, extra)
	w.mu.Unlock()
	subs := append(slices.Clone(w.base), extra)
	nd := w.startNode(subs, true)
	w.mu.Lock()
	off := w.faultsOff
	w.mu.Unlock()
	if !off {
		var wg = &nd.closeWG
		nd.produce(wg)
	}
}

// restartOne starts a new node in place of one that crashed or closed,
// with its subscriptions (a process restarted).
func (w *world) restartOne() {
	w.mu.Lock()
	var gone []*node
	for _, nd := range w.nodes {
		if !nd.alive() && !nd.replaced {
			gone = append(gone, nd)
		}
	}
	w.mu.Unlock()
	if len(gone) == 0 {
		return
	}
	old := gone[w.intn(len(gone))]
	old.replaced = true
	nd := w.startNode(old.subs, false)
	w.mu.Lock()
	off := w.faultsOff
	w.mu.Unlock()
	if !off {
		nd.produce(&nd.closeWG)
	}
}

// outage takes a subscription's destination down for a while: its
// handlers answer Unavailable.
func (w *world) outage() {
	w.mu.Lock()
	defer w.mu.Unlock()
	sp := w.specs[w.draws.intn(len(w.specs))]
	d := w.draws.dur(0, 5*time.Second)
	w.outages[sp.name] = w.now() + d
	w.logLocked("OUTAGE of %s for %v", sp.name, d)
}

// pauseOne pauses a subscription for a while.
func (w *world) pauseOne(ctx context.Context) {
	nd := w.pickLive(1)
	if nd == nil {
		return
	}
	sp := nd.subs[w.intn(len(nd.subs))]
	// A Pause that failed may have taken effect all the same (an error
	// after the write): it is resumed like one that did not fail.
	octx, cancel := opContext()
	defer cancel()
	err := nd.ob.Pause(octx, sp.name)
	d := w.dur(0, 3*time.Second)
	w.logf("%s: PAUSE %s for %v (%v)", nd.name, sp.name, d, err)
	w.mu.Lock()
	w.paused[sp.name] = true
	w.everPaused[sp.name] = true
	w.mu.Unlock()
	w.bg.Go(func() {
		t := time.NewTimer(d)
		select {
		case <-t.C:
			w.resume(sp.name)
		case <-ctx.Done(): // heal resumes it
			t.Stop()
		}
	})
}

// opContext bounds an operator's call: the instance it goes to may crash
// meanwhile, and a crashed instance does not answer.
func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// resume resumes sub through a live node (until one takes it, or
// another resume did).
func (w *world) resume(sub string) {
	for {
		w.mu.Lock()
		paused := w.paused[sub]
		w.mu.Unlock()
		if !paused {
			return
		}
		nd := w.pickLive(1)
		if nd != nil {
			ctx, cancel := opContext()
			err := nd.ob.Resume(ctx, sub)
			cancel()
			if err == nil {
				w.mu.Lock()
				delete(w.paused, sub)
				w.mu.Unlock()
				w.logf("%s: RESUME %s", nd.name, sub)
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// replay makes the dead letters due again.
func (w *world) replay() {
	nd := w.pickLive(1)
	if nd == nil {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	n, err := nd.ob.Replay(ctx, outbox.DeadFilter{}, false)
	w.logf("%s: REPLAY dead letters: %d, %v", nd.name, n, err)
}

// skipBlocked gives up on the dead events that block keys.
func (w *world) skipBlocked() {
	nd := w.pickLive(1)
	if nd == nil {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	bks, err := nd.ob.BlockedKeys(ctx, "", 10)
	if err != nil || len(bks) == 0 {
		return
	}
	var ids []string
	for _, bk := range bks {
		ids = append(ids, bk.EventID)
	}
	w.mu.Lock()
	for _, id := range ids {
		w.skipped[id] = true
	}
	w.mu.Unlock()
	n, err := nd.ob.SkipDead(ctx, ids...)
	w.logf("%s: SKIP dead %v: %d, %v", nd.name, ids, n, err)
}

// heal ends the faults: frozen nodes thaw, outages and pauses end, and
// every subscription set that no live node runs is started again.
func (w *world) heal() {
	w.bg.Wait()
	w.mu.Lock()
	w.outages = map[string]time.Duration{}
	// Every subscription ever paused, not only those still marked: two
	// overlapping pauses of one subscription race with their resumes (the
	// first resume can land before the second pause and clear its mark),
	// and a pause is not counted.
	var paused []string
	for s := range w.everPaused {
		w.paused[s] = true
		paused = append(paused, s)
	}
	nodes := slices.Clone(w.nodes)
	w.mu.Unlock()
	for _, nd := range nodes {
		nd.frozen.Store(0)
	}
	slices.Sort(paused)
	for _, s := range paused {
		w.resume(s)
	}
	for _, nd := range nodes {
		if !nd.alive() && !nd.replaced {
			nd.replaced = true
			w.startNode(nd.subs, false)
		}
	}
}
