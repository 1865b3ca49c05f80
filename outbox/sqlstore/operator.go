package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The operator queries: lag per subscription and dead letters by filter,
// for the command line, the admin API and users' own tools.

var _ driver.OperatorStore = (*Store)(nil)

// Lag implements driver.OperatorStore: two grouped scans, one of the
// undelivered events by type and one of the deliveries by subscription,
// then the database's clock. Ages count from the events' publication
// (a delivery's age is its event's, not its split's), and the clock is
// read after the scans: every row they saw was written before it, so no
// age comes out negative.
func (s *Store) Lag(ctx context.Context, subs []driver.SubscriptionInfo) ([]outbox.Lag, error) {
	byType, err := s.lagByType(ctx)
	if err != nil {
		return nil, err
	}
	owed, err := s.lagDeliveries(ctx)
	if err != nil {
		return nil, err
	}
	var now dbTime
	if err := s.db.QueryRowContext(ctx, `SELECT `+s.d.now).Scan(&now); err != nil {
		return nil, fmt.Errorf("sqlstore: lag: %w", err)
	}
	out := make([]outbox.Lag, len(subs))
	index := map[string]int{}
	for i, sub := range subs {
		out[i].Subscription = sub.Name
		index[sub.Name] = i
		for t, g := range byType {
			if len(sub.Types) == 0 || slices.Contains(sub.Types, string(t)) {
				out[i].Pending += g.n
				out[i].Oldest = max(out[i].Oldest, now.Sub(g.oldest.Time))
			}
		}
	}
	for _, g := range owed {
		i, ok := index[g.subscription]
		if !ok {
			// Deliveries of a subscription no instance registers.
			i = len(out)
			index[g.subscription] = i
			out = append(out, outbox.Lag{Subscription: g.subscription, Unregistered: true})
		}
		l := &out[i]
		switch g.status {
		case outbox.StatusNew:
			l.Pending += g.n
		case outbox.StatusRetry:
			l.Retrying += g.n
		case outbox.StatusDead:
			l.Dead += g.n
			continue
		}
		l.Oldest = max(l.Oldest, now.Sub(g.oldest.Time))
	}
	return out, nil
}

// lagGroup is one row of Lag's scans: a count and the oldest publication.
type lagGroup struct {
	subscription string
	status       outbox.Status
	n            int64
	oldest       dbTime
}

// lagByType counts the undelivered events (NEW and RETRY) by type.
func (s *Store) lagByType(ctx context.Context) (map[outbox.EventType]lagGroup, error) {
	rs, err := s.db.QueryContext(ctx, `SELECT event_type, COUNT(*), MIN(created_at) FROM `+s.table+` WHERE status IN (0, 2) GROUP BY event_type`)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: lag: %w", s.explain(err))
	}
	defer rs.Close()
	byType := map[outbox.EventType]lagGroup{}
	for rs.Next() {
		var t string
		var g lagGroup
		if err := rs.Scan(&t, &g.n, &g.oldest); err != nil {
			return nil, fmt.Errorf("sqlstore: lag: %w", err)
		}
		byType[outbox.EventType(t)] = g
	}
	return byType, rs.Err()
}

// lagDeliveries counts the deliveries owed (NEW, RETRY, DEAD) by
// subscription and state, with the publication of the oldest one's event
// (the event's row stays in the table while a delivery is owed; the
// delivery's own created_at, its split, stands in should it not).
func (s *Store) lagDeliveries(ctx context.Context) ([]lagGroup, error) {
	rs, err := s.db.QueryContext(ctx, `SELECT d.subscription, d.status, COUNT(*), MIN(COALESCE(e.created_at, d.created_at)) FROM `+s.DeliveriesTable()+` d LEFT JOIN `+s.table+` e ON e.id = d.event_id WHERE d.status IN (0, 2, 3) GROUP BY d.subscription, d.status`)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: lag: %w", s.explainSubs(err))
	}
	defer rs.Close()
	var out []lagGroup
	for rs.Next() {
		var g lagGroup
		var status int
		if err := rs.Scan(&g.subscription, &status, &g.n, &g.oldest); err != nil {
			return nil, fmt.Errorf("sqlstore: lag: %w", err)
		}
		g.status = outbox.Status(status)
		out = append(out, g)
	}
	return out, rs.Err()
}

// likeContains returns a LIKE pattern (with '!' as the escape character)
// matching text anywhere.
func likeContains(text string) string {
	return "%" + strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(text) + "%"
}

// deadWhere returns the conditions and arguments of f for a query whose
// events table is aliased e and whose error column is errCol.
func (s *Store) deadWhere(f outbox.DeadFilter, errCol string) (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, arg any) { conds = append(conds, cond); args = append(args, arg) }
	add("e.id > ?", f.After)
	if f.Type != "" {
		add("e.event_type = ?", string(f.Type))
	}
	if !f.Since.IsZero() {
		add("e.created_at >= ?", s.d.timeArg(f.Since))
	}
	if !f.Until.IsZero() {
		add("e.created_at < ?", s.d.timeArg(f.Until))
	}
	if f.ErrorContains != "" {
		add(errCol+" LIKE ? ESCAPE '!'", likeContains(f.ErrorContains))
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "e.id IN (?"+strings.Repeat(", ?", len(f.IDs)-1)+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	return strings.Join(conds, " AND "), args
}

// FindDead implements driver.OperatorStore.
func (s *Store) FindDead(ctx context.Context, f outbox.DeadFilter) ([]outbox.DeadLetter, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []outbox.DeadLetter
	if f.Subscription == "" {
		where, args := s.deadWhere(f, "e.last_error")
		q := s.rebind(`SELECT e.id, '', e.event_type, e.aggregate_type, e.aggregate_id, e.tenant_id, e.attempts, COALESCE(e.last_error, ''), e.created_at
FROM ` + s.table + ` e WHERE e.status = 3 AND ` + where + ` ORDER BY e.id LIMIT ?`)
		dls, err := s.scanDead(ctx, q, append(args, limit)...)
		if err != nil {
			return nil, err
		}
		out = dls
	}
	where, args := s.deadWhere(f, "d.last_error")
	if f.Subscription != "" {
		where += " AND d.subscription = ?"
		args = append(args, f.Subscription)
	}
	q := s.rebind(`SELECT e.id, d.subscription, e.event_type, e.aggregate_type, e.aggregate_id, e.tenant_id, d.attempts, COALESCE(d.last_error, ''), e.created_at
FROM ` + s.DeliveriesTable() + ` d JOIN ` + s.table + ` e ON e.id = d.event_id
WHERE d.status = 3 AND ` + where + ` ORDER BY d.event_id, d.subscription LIMIT ?`)
	more, err := s.scanDead(ctx, q, append(args, limit+1)...)
	if err != nil {
		return nil, s.explainSubs(err)
	}
	out = append(out, more...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if len(out) > limit {
		cut := limit
		for cut < len(out) && out[cut].ID == out[cut-1].ID {
			cut++
		}
		last := out[cut-1].ID
		if cut == len(out) && len(more) > limit && more[len(more)-1].ID == last {
			// The deliveries query stopped inside this event: leave it
			// whole to the next page, unless it is all there is.
			for cut > 0 && out[cut-1].ID == last {
				cut--
			}
			if cut == 0 {
				cut = len(out)
			}
		}
		out = out[:cut]
	}
	return out, nil
}

func (s *Store) scanDead(ctx context.Context, q string, args ...any) ([]outbox.DeadLetter, error) {
	rs, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: list dead letters: %w", err)
	}
	defer rs.Close()
	var out []outbox.DeadLetter
	for rs.Next() {
		var dl outbox.DeadLetter
		var created dbTime
		if err := rs.Scan(&dl.ID, &dl.Subscription, &dl.Type, &dl.AggregateType, &dl.AggregateID, &dl.TenantID, &dl.Attempts, &dl.LastError, &created); err != nil {
			return nil, fmt.Errorf("sqlstore: list dead letters: %w", err)
		}
		dl.CreatedAt = created.Time
		out = append(out, dl)
	}
	return out, rs.Err()
}

// ReplayDead implements driver.OperatorStore. Replayed rows are due at
// their original creation time, so that claims, which take the earliest
// due first, deliver them in publish order.
func (s *Store) ReplayDead(ctx context.Context, f outbox.DeadFilter, dryRun bool) (int, error) {
	total := 0
	f.Limit = 500
	for {
		page, err := s.FindDead(ctx, f)
		if err != nil {
			return total, err
		}
		if len(page) == 0 {
			return total, nil
		}
		f.After = page[len(page)-1].ID
		if dryRun {
			total += len(page)
			continue
		}
		var ids []string
		var keys []driver.DeliveryID
		for _, dl := range page {
			if dl.Subscription == "" {
				ids = append(ids, dl.ID)
			} else {
				keys = append(keys, driver.DeliveryID{EventID: dl.ID, Subscription: dl.Subscription})
			}
		}
		if len(ids) > 0 {
			n, err := s.execCount(ctx, s.replaySQL(len(ids)), s.idArgs(ids)...)
			total += n
			if err != nil {
				return total, err
			}
		}
		if len(keys) > 0 {
			q := s.rebind(`UPDATE ` + s.DeliveriesTable() + s.d.byID + ` SET status = 0, attempts = 0, available_at = (SELECT e.created_at FROM ` + s.table + ` e WHERE e.id = event_id), done_at = NULL, locked_by = NULL, locked_until = NULL
WHERE status = 3 AND ` + keysIn(len(keys)))
			n, err := s.execCount(ctx, q, keyArgs(keys)...)
			total += n
			if err != nil {
				return total, err
			}
		}
	}
}
