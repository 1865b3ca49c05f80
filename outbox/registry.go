package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// registry is an immutable view of the subscriptions: this instance's own
// and what the database says of every instance's (remote ones, paused
// ones). It is replaced as a whole.
type registry struct {
	local  []*subscription
	byName map[string]*subscription
	byType map[EventType][]*subscription
	all    []*subscription

	// From the database, refreshed every PollInterval.
	// version is the registry's version (driver.Registration.Version) that
	// remote was read with: the completing writes of the events whose
	// subscriptions were decided by this snapshot carry it, and change
	// nothing if a subscription was registered since (the registry fence).
	version     int64
	remote      map[string][]EventType // subscriptions of other instances only; nil types: all
	remoteOrder map[string]Order       // the ordered ones among them
	paused      map[string]bool
	expired     []string // registered, but by no instance for SubscriptionExpiry

	// The ordered subscriptions, here and elsewhere (indexOrder).
	filter       driver.OrderFilter
	orderedAll   bool // one takes every type
	orderedTypes map[EventType]bool
}

func (r *registry) with(s *subscription) *registry {
	n := &registry{
		local:       append(slices.Clone(r.local), s),
		byName:      make(map[string]*subscription, len(r.byName)+1),
		version:     r.version,
		remote:      r.remote,
		remoteOrder: r.remoteOrder,
		paused:      r.paused,
		expired:     r.expired,
	}
	for k, v := range r.byName {
		n.byName[k] = v
	}
	n.byName[s.Name] = s
	n.index()
	return n
}

func (r *registry) index() {
	r.byType = map[EventType][]*subscription{}
	r.all = nil
	for _, s := range r.local {
		if s.all {
			r.all = append(r.all, s)
			continue
		}
		for _, t := range s.Types {
			if !slices.Contains(r.byType[t], s) {
				r.byType[t] = append(r.byType[t], s)
			}
		}
	}
	r.indexOrder()
}

// has reports whether a subscription of this instance takes type t.
func (r *registry) has(t EventType) bool { return len(r.all) > 0 || len(r.byType[t]) > 0 }

// match returns this instance's subscriptions for type t.
func (r *registry) match(t EventType) []*subscription {
	typed := r.byType[t]
	if len(r.all) == 0 {
		return typed
	}
	if len(typed) == 0 {
		return r.all
	}
	return append(append(make([]*subscription, 0, len(typed)+len(r.all)), typed...), r.all...)
}

// owedElsewhere returns the names of the subscriptions of other instances
// that take type t: an event of type t is complete only once they have it
// too. The answer holds for the registry's version (r.version) only: the
// write that completes the event carries it.
func (r *registry) owedElsewhere(t EventType) []string {
	var names []string
	for name, types := range r.remote {
		if len(types) == 0 || slices.Contains(types, t) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// claimTypes returns the type filter of this instance's claims
// (driver.ClaimRequest.Types, NotTypes): an instance claims only events
// that one of its subscriptions takes, and the events of types that no
// subscription anywhere takes (which it completes at once), never those
// of types served only elsewhere, which it could only hand back.
func (r *registry) claimTypes() (only, not []string) {
	if len(r.all) > 0 {
		return nil, nil
	}
	mine := make([]string, 0, len(r.byType))
	for t := range r.byType {
		mine = append(mine, string(t))
	}
	slices.Sort(mine)
	for _, types := range r.remote {
		if len(types) == 0 {
			return mine, nil // a subscription elsewhere takes the rest
		}
	}
	for _, types := range r.remote {
		for _, t := range types {
			if r.byType[t] == nil && !slices.Contains(not, string(t)) {
				not = append(not, string(t))
			}
		}
	}
	slices.Sort(not)
	return nil, not
}

// claimable returns the names of this instance's subscriptions whose
// deliveries the poller should claim: those with a closed circuit, and
// those whose open circuit is due for a probe. Paused ones take nothing.
func (r *registry) claimable() (closed, probing []string) {
	for _, s := range r.local {
		if r.paused[s.Name] {
			continue
		}
		switch s.circuit.claim() {
		case claimAll:
			closed = append(closed, s.Name)
		case claimProbe:
			probing = append(probing, s.Name)
		}
	}
	return closed, probing
}

// gated splits names into the subscriptions without a rate limit and
// those with one (whose deliveries are claimed by their gates' room).
func (r *registry) gated(names []string) (free []string, limited []*subscription) {
	free = names[:0:0]
	for _, n := range names {
		if s := r.byName[n]; s != nil && s.gate != nil {
			limited = append(limited, s)
		} else {
			free = append(free, n)
		}
	}
	return free, limited
}

// Pause stops the delivery of a subscription on every instance sharing
// the table (each obeys within its PollInterval; this one at once): its
// events wait, attempts unchanged, while the other subscriptions go on.
func (o *Outbox) Pause(ctx context.Context, name string) error {
	return o.reg.setPaused(ctx, name, true)
}

// Resume undoes Pause.
func (o *Outbox) Resume(ctx context.Context, name string) error {
	if err := o.reg.setPaused(ctx, name, false); err != nil {
		return err
	}
	o.poller.wake()
	return nil
}

// CircuitStates returns the state of each subscription's circuit on this
// instance.
func (o *Outbox) CircuitStates() map[string]CircuitState {
	m := map[string]CircuitState{}
	for _, s := range o.reg.load().local {
		m[s.Name] = s.circuit.state()
	}
	return m
}

// SubscriptionStatus is a subscription as this instance sees it.
type SubscriptionStatus struct {
	Name string
	// Types are the event types it takes; nil: every type.
	Types []EventType
	// Local is set for this instance's own subscriptions; the others are
	// registered in the database by other instances.
	Local bool
	// Paused is the cluster-wide pause, as of the last refresh.
	Paused bool
	// Circuit is the state of its circuit here (local ones only).
	Circuit CircuitState
	// Rate is its rate limit here, in events a second (local ones only;
	// 0: none).
	Rate float64
}

// Subscriptions returns the subscriptions this instance knows, its own
// first, then the others registered in the database, each in name order.
func (o *Outbox) Subscriptions() []SubscriptionStatus {
	reg := o.reg.load()
	var out []SubscriptionStatus
	for _, s := range reg.local {
		out = append(out, SubscriptionStatus{Name: s.Name, Types: slices.Clone(s.Types), Local: true, Paused: reg.paused[s.Name], Circuit: s.circuit.state(), Rate: s.Rate})
	}
	slices.SortFunc(out, func(a, b SubscriptionStatus) int { return strings.Compare(a.Name, b.Name) })
	var remote []SubscriptionStatus
	for name, types := range reg.remote {
		remote = append(remote, SubscriptionStatus{Name: name, Types: slices.Clone(types), Paused: reg.paused[name]})
	}
	slices.SortFunc(remote, func(a, b SubscriptionStatus) int { return strings.Compare(a.Name, b.Name) })
	return append(out, remote...)
}

func typeNames(ts []EventType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

func eventTypes(ts []string) []EventType {
	if len(ts) == 0 {
		return nil // every type
	}
	out := make([]EventType, len(ts))
	for i, t := range ts {
		out[i] = EventType(t)
	}
	return out
}

// sync registers this instance's subscriptions and learns the
// others' and which are paused. Syncs run one at a time, each reading and
// applying before the next reads: otherwise the periodic refresh, having
// read before a Pause committed, could apply its older states after the
// Pause's own sync and undo it here until the next refresh.
func (g *registrar) sync(ctx context.Context) error {
	select {
	case g.syncing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-g.syncing }()
	cur := g.load()
	infos := make([]driver.SubscriptionInfo, len(cur.local))
	for i, s := range cur.local {
		infos[i] = driver.SubscriptionInfo{Name: s.Name, Types: typeNames(s.Types), Order: int8(s.Order)}
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	reg, err := g.dstore.SyncSubscriptions(ctx, infos)
	if err != nil {
		return err
	}
	g.applyStates(reg)
	return nil
}

// syncIfOlder syncs the registry unless a sync since the snapshot of
// version v (whose completing write the store refused) has already
// learned a newer one.
func (g *registrar) syncIfOlder(ctx context.Context, v int64) error {
	if g.load().version > v {
		return nil
	}
	return g.sync(ctx)
}

// applyStates replaces the database's part of the registry.
func (g *registrar) applyStates(reg driver.Registration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.load()
	next := &registry{local: cur.local, byName: cur.byName, byType: cur.byType, all: cur.all, version: reg.Version,
		remote: map[string][]EventType{}, remoteOrder: map[string]Order{}, paused: map[string]bool{},
		expired: expiredOf(reg, cur.byName, g.cfg.SubscriptionExpiry)}
	for _, st := range reg.Subscriptions {
		if st.Paused {
			next.paused[st.Name] = true
		}
		if cur.byName[st.Name] != nil || st.Idle > g.cfg.SubscriptionExpiry {
			continue
		}
		next.remote[st.Name] = eventTypes(st.Types)
		if o := Order(st.Order); o == Ordered || o == OrderedSkipDead {
			next.remoteOrder[st.Name] = o
		}
	}
	next.indexOrder()
	for name := range cur.paused {
		if !next.paused[name] && cur.byName[name] != nil {
			g.log.Info("subscription resumed", slog.String("subscription", name))
		}
	}
	for name := range next.paused {
		if !cur.paused[name] && cur.byName[name] != nil {
			g.log.Info("subscription paused: its events wait", slog.String("subscription", name))
		}
	}
	g.cur.Store(next)
}

// run refreshes the registry every PollInterval.
func (g *registrar) run(ctx context.Context) {
	t := time.NewTicker(g.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.sync(ctx); err != nil {
			if ctx.Err() == nil {
				g.log.Error("refresh the subscriptions from the database", slog.Any("error", err))
			}
			continue
		}
		g.retireExpired(ctx)
	}
}

func (g *registrar) setPaused(ctx context.Context, name string, paused bool) error {
	known, err := g.dstore.SetPaused(ctx, name, paused)
	if err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("outbox: no subscription named %q is registered (subscriptions are registered when an instance that has them starts)", name)
	}
	return g.sync(ctx)
}

// noListener counts an event this instance has no listener for and logs
// it at most once a minute per event type.
func (g *registrar) noListener(id string, t EventType) {
	g.m.NoListener(t)
	if g.onceAMinute(g.noListenerLog, t) {
		g.log.Warn("no listener here for this event type: handed back for an instance that has one (logged once a minute per type)",
			slog.String("event_id", id), slog.String("event_type", string(t)), slog.Duration("retry_in", g.cfg.NoListenerDelay))
	}
}

// unowned counts and logs (at most once a minute per type) an event
// that no subscription anywhere takes: it is completed without delivery.
func (g *registrar) unowned(id string, t EventType) {
	g.m.NoListener(t)
	if g.onceAMinute(g.unownedLog, t) {
		g.log.Warn("no subscription on any instance takes this event type: completed without delivery (logged once a minute per type)",
			slog.String("event_id", id), slog.String("event_type", string(t)))
	}
}

// onceAMinute reports whether a warning about type t kept in logged is
// due (none in the last minute), and if so notes it as given now.
func (g *registrar) onceAMinute(logged map[EventType]time.Time, t EventType) bool {
	now := time.Now()
	g.noListenerMu.Lock()
	defer g.noListenerMu.Unlock()
	if last, seen := logged[t]; seen && now.Sub(last) < time.Minute {
		return false
	}
	logged[t] = now
	return true
}

// registrar holds the subscriptions: this instance's, as registered with
// Subscribe, and the database's (other instances' subscriptions, which
// are paused), refreshed every PollInterval. Readers take an immutable
// snapshot (load) without locking.
type registrar struct {
	*deps
	mu      sync.Mutex // serialises changes of cur
	cur     atomic.Pointer[registry]
	syncing chan struct{} // held (one slot) for a whole sync: read, then apply

	noListenerMu  sync.Mutex
	noListenerLog map[EventType]time.Time // last warning per type
	unownedLog    map[EventType]time.Time // last warning per type (unowned)
	runner
}

func newRegistrar(d *deps) *registrar {
	g := &registrar{deps: d, noListenerLog: map[EventType]time.Time{}, unownedLog: map[EventType]time.Time{}, syncing: make(chan struct{}, 1)}
	reg := &registry{byName: map[string]*subscription{}}
	reg.index()
	g.cur.Store(reg)
	return g
}

// load returns the current snapshot.
func (g *registrar) load() *registry { return g.cur.Load() }
