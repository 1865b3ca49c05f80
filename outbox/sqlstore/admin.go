package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// The administration queries behind cmd/outboxctl: read-only views of the
// subscriptions, counts per event type, the next due rows, the applied
// migrations, and the writes an operator asks for (replay of given dead
// letters, purge of dead letters, a dry run of Cleanup).

// Subscriptions returns the subscriptions the database knows, in name
// order, without registering any (unlike SyncSubscriptions).
func (s *Store) Subscriptions(ctx context.Context) ([]driver.SubscriptionState, error) {
	rs, err := s.db.QueryContext(ctx, `SELECT name, event_types, ordering, paused, seen_at, `+s.d.now+` FROM `+s.SubscriptionsTable()+` ORDER BY name`)
	if err != nil {
		return nil, s.explainSubs(fmt.Errorf("sqlstore: read subscriptions: %w", err))
	}
	defer rs.Close()
	var out []driver.SubscriptionState
	for rs.Next() {
		var st driver.SubscriptionState
		var types sql.NullString
		var seen, now dbTime
		if err := rs.Scan(&st.Name, &types, &st.Order, &st.Paused, &seen, &now); err != nil {
			return nil, fmt.Errorf("sqlstore: read subscriptions: %w", err)
		}
		if types.Valid && types.String != "" {
			if err := json.Unmarshal([]byte(types.String), &st.Types); err != nil {
				return nil, fmt.Errorf("sqlstore: read subscriptions: %q: event_types is not a JSON array: %w", st.Name, err)
			}
		}
		st.Idle = max(0, now.Sub(seen.Time))
		out = append(out, st)
	}
	return out, rs.Err()
}

// TypeStats are the counts of one event type's undelivered events.
type TypeStats struct {
	Type outbox.EventType
	// New, Retry, Dead and Split count the type's events by status.
	New, Retry, Dead, Split int64
	// DeadDeliveries counts the dead deliveries of the type's split
	// events; Dead + DeadDeliveries are its dead letters.
	DeadDeliveries int64
	// Oldest is the age of the oldest NEW or RETRY event of the type, on
	// the database's clock; 0 if none.
	Oldest time.Duration
}

// StatsByType returns the counts of the event types that have events not
// DONE, in type order.
func (s *Store) StatsByType(ctx context.Context) ([]TypeStats, error) {
	var now dbTime
	if err := s.db.QueryRowContext(ctx, `SELECT `+s.d.now).Scan(&now); err != nil {
		return nil, fmt.Errorf("sqlstore: stats by type: %w", err)
	}
	rs, err := s.db.QueryContext(ctx, `SELECT event_type, status, COUNT(*), MIN(created_at) FROM `+s.table+` WHERE status IN (0, 2, 3, 4) GROUP BY event_type, status`)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: stats by type: %w", s.explain(err))
	}
	defer rs.Close()
	byType := map[outbox.EventType]*TypeStats{}
	for rs.Next() {
		var t string
		var status int
		var n int64
		var oldest dbTime
		if err := rs.Scan(&t, &status, &n, &oldest); err != nil {
			return nil, fmt.Errorf("sqlstore: stats by type: %w", err)
		}
		ts := byType[outbox.EventType(t)]
		if ts == nil {
			ts = &TypeStats{Type: outbox.EventType(t)}
			byType[ts.Type] = ts
		}
		switch outbox.Status(status) {
		case outbox.StatusNew:
			ts.New = n
		case outbox.StatusRetry:
			ts.Retry = n
		case outbox.StatusDead:
			ts.Dead = n
		case outbox.StatusSplit:
			ts.Split = n
		}
		if st := outbox.Status(status); st == outbox.StatusNew || st == outbox.StatusRetry {
			ts.Oldest = max(ts.Oldest, now.Sub(oldest.Time))
		}
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("sqlstore: stats by type: %w", err)
	}
	rs.Close()
	if err := s.deadDeliveriesByType(ctx, byType); err != nil {
		return nil, err
	}
	out := make([]TypeStats, 0, len(byType))
	for _, ts := range byType {
		out = append(out, *ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out, nil
}

// deadDeliveriesByType adds the dead deliveries of split events to
// byType, per event type.
func (s *Store) deadDeliveriesByType(ctx context.Context, byType map[outbox.EventType]*TypeStats) error {
	rs, err := s.db.QueryContext(ctx, `SELECT e.event_type, COUNT(*) FROM `+s.DeliveriesTable()+` d JOIN `+s.table+` e ON e.id = d.event_id WHERE d.status = 3 GROUP BY e.event_type`)
	if err != nil {
		return fmt.Errorf("sqlstore: stats by type: %w", s.explainSubs(err))
	}
	defer rs.Close()
	for rs.Next() {
		var t string
		var n int64
		if err := rs.Scan(&t, &n); err != nil {
			return fmt.Errorf("sqlstore: stats by type: %w", err)
		}
		ts := byType[outbox.EventType(t)]
		if ts == nil {
			ts = &TypeStats{Type: outbox.EventType(t)}
			byType[ts.Type] = ts
		}
		ts.DeadDeliveries = n
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("sqlstore: stats by type: %w", err)
	}
	return nil
}

// Due is an event or a delivery that a claim would take when due, as Peek
// shows it: no payload.
type Due struct {
	ID string
	// Subscription is "" for an event not split per subscription.
	Subscription string
	Type         outbox.EventType
	Status       outbox.Status
	Attempts     int
	// In is how long until it is due (≤ 0: due now), on the database's
	// clock.
	In time.Duration
	// Owner holds a live lease on it, or "".
	Owner string
}

// Peek returns up to limit NEW and RETRY events and deliveries, the
// earliest due first, without leasing them.
func (s *Store) Peek(ctx context.Context, limit int) ([]Due, error) {
	if limit <= 0 {
		limit = 20
	}
	var now dbTime
	if err := s.db.QueryRowContext(ctx, `SELECT `+s.d.now).Scan(&now); err != nil {
		return nil, fmt.Errorf("sqlstore: peek: %w", err)
	}
	type due struct {
		Due
		at dbTime
	}
	var all []due
	scan := func(q string) error {
		rs, err := s.db.QueryContext(ctx, s.rebind(q), limit)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var d due
			var typ string
			var status int
			var until dbTime
			if err := rs.Scan(&d.ID, &d.Subscription, &typ, &status, &d.Attempts, &d.at, &d.Owner, &until); err != nil {
				return err
			}
			d.Type, d.Status = outbox.EventType(typ), outbox.Status(status)
			d.In = d.at.Sub(now.Time)
			if !until.After(now.Time) {
				d.Owner = ""
			}
			all = append(all, d)
		}
		return rs.Err()
	}
	if err := scan(`SELECT id, '', event_type, status, attempts, available_at, COALESCE(locked_by, ''), locked_until FROM ` + s.table + `
WHERE status IN (0, 2) ORDER BY available_at, id LIMIT ?`); err != nil {
		return nil, fmt.Errorf("sqlstore: peek: %w", s.explain(err))
	}
	if err := scan(`SELECT d.event_id, d.subscription, e.event_type, d.status, d.attempts, d.available_at, COALESCE(d.locked_by, ''), d.locked_until
FROM ` + s.DeliveriesTable() + ` d JOIN ` + s.table + ` e ON e.id = d.event_id
WHERE d.status IN (0, 2) ORDER BY d.available_at, d.event_id, d.subscription LIMIT ?`); err != nil {
		return nil, fmt.Errorf("sqlstore: peek: %w", s.explainSubs(err))
	}
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].at.Equal(all[j].at.Time) {
			return all[i].at.Before(all[j].at.Time)
		}
		if all[i].ID != all[j].ID {
			return all[i].ID < all[j].ID
		}
		return all[i].Subscription < all[j].Subscription
	})
	out := make([]Due, 0, min(limit, len(all)))
	for i := 0; i < len(all) && i < limit; i++ {
		out = append(out, all[i].Due)
	}
	return out, nil
}

// AppliedMigrations returns the migrations recorded in SchemaTable, in
// version order, without their SQL.
func (s *Store) AppliedMigrations(ctx context.Context) ([]Migration, error) {
	rs, err := s.db.QueryContext(ctx, `SELECT version, name FROM `+s.SchemaTable()+` ORDER BY version`)
	if err != nil {
		if s.d.missingTable(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("sqlstore: read %s: %w", s.SchemaTable(), err)
	}
	defer rs.Close()
	var out []Migration
	for rs.Next() {
		var m Migration
		if err := rs.Scan(&m.Version, &m.Name); err != nil {
			return nil, fmt.Errorf("sqlstore: read %s: %w", s.SchemaTable(), err)
		}
		out = append(out, m)
	}
	return out, rs.Err()
}

// splitLetters separates dead letters into dead events and dead
// deliveries.
func splitLetters(dls []outbox.DeadLetter) (ids []string, keys []driver.DeliveryID) {
	for _, dl := range dls {
		if dl.Subscription == "" {
			ids = append(ids, dl.ID)
		} else {
			keys = append(keys, driver.DeliveryID{EventID: dl.ID, Subscription: dl.Subscription})
		}
	}
	return ids, keys
}

// ReplayLetters is ReplayDead for exactly the given dead letters (as
// FindDead returned them): a dead delivery is replayed for its
// subscription only. Letters no longer dead are left alone. It returns how
// many it changed.
func (s *Store) ReplayLetters(ctx context.Context, dls []outbox.DeadLetter) (int, error) {
	ids, keys := splitLetters(dls)
	total := 0
	for len(ids) > 0 {
		k := min(len(ids), 500)
		q := s.rebind(`UPDATE ` + s.table + s.d.byID + ` SET status = 0, attempts = 0, available_at = created_at, done_at = NULL, locked_by = NULL, locked_until = NULL
WHERE status = 3 AND id IN ` + in(k))
		n, err := s.execCount(ctx, q, stringArgs(ids[:k])...)
		total += n
		if err != nil {
			return total, fmt.Errorf("sqlstore: replay: %w", err)
		}
		ids = ids[k:]
	}
	for len(keys) > 0 {
		k := min(len(keys), 500)
		q := s.rebind(`UPDATE ` + s.DeliveriesTable() + s.d.byID + ` SET status = 0, attempts = 0, available_at = (SELECT e.created_at FROM ` + s.table + ` e WHERE e.id = event_id), done_at = NULL, locked_by = NULL, locked_until = NULL
WHERE status = 3 AND ` + keysIn(k))
		n, err := s.execCount(ctx, q, keyArgs(keys[:k])...)
		total += n
		if err != nil {
			return total, fmt.Errorf("sqlstore: replay: %w", s.explainSubs(err))
		}
		keys = keys[k:]
	}
	return total, nil
}

// PurgeLetters deletes exactly the given dead letters: a DEAD event with
// its deliveries, a dead delivery alone, and then its split event if none
// of its deliveries is left pending or dead (with the done ones). Letters
// no longer dead are left alone. It returns how many dead letters it
// deleted.
func (s *Store) PurgeLetters(ctx context.Context, dls []outbox.DeadLetter) (int, error) {
	ids, keys := splitLetters(dls)
	total := 0
	for len(ids) > 0 {
		k := min(len(ids), 500)
		n, err := s.execCount(ctx, s.rebind(`DELETE FROM `+s.table+` WHERE status = 3 AND id IN `+in(k)), stringArgs(ids[:k])...)
		total += n
		if err != nil {
			return total, fmt.Errorf("sqlstore: purge: %w", err)
		}
		if err := s.dropOrphanDeliveries(ctx, ids[:k]); err != nil {
			return total, err
		}
		ids = ids[k:]
	}
	for len(keys) > 0 {
		k := min(len(keys), 500)
		n, err := s.execCount(ctx, s.rebind(`DELETE FROM `+s.DeliveriesTable()+` WHERE status = 3 AND `+keysIn(k)), keyArgs(keys[:k])...)
		total += n
		if err != nil {
			return total, fmt.Errorf("sqlstore: purge: %w", s.explainSubs(err))
		}
		events := eventIDs(keys[:k])
		finished := ` WHERE status = 4 AND id IN ` + in(len(events)) + ` AND id NOT IN (SELECT event_id FROM ` + s.DeliveriesTable() + ` WHERE status IN (0, 2, 3) AND event_id IN ` + in(len(events)) + `)`
		args := append(stringArgs(events), stringArgs(events)...)
		if _, err := s.execCount(ctx, s.rebind(`DELETE FROM `+s.table+finished), args...); err != nil {
			return total, fmt.Errorf("sqlstore: purge: %w", err)
		}
		if err := s.dropOrphanDeliveries(ctx, events); err != nil {
			return total, err
		}
		keys = keys[k:]
	}
	return total, nil
}

// dropOrphanDeliveries deletes the deliveries of those of ids whose event
// is gone.
func (s *Store) dropOrphanDeliveries(ctx context.Context, ids []string) error {
	q := s.rebind(`DELETE FROM ` + s.DeliveriesTable() + ` WHERE event_id IN ` + in(len(ids)) + ` AND event_id NOT IN (SELECT id FROM ` + s.table + ` WHERE id IN ` + in(len(ids)) + `)`)
	if _, err := s.execCount(ctx, q, append(stringArgs(ids), stringArgs(ids)...)...); err != nil {
		return fmt.Errorf("sqlstore: purge deliveries: %w", s.explainSubs(err))
	}
	return nil
}

// CleanupCount returns how many events Cleanup(ctx, olderThan, ∞,
// includeDead) would delete now, deleting nothing.
func (s *Store) CleanupCount(ctx context.Context, olderThan time.Duration, includeDead bool) (int64, error) {
	q := `SELECT COUNT(*) FROM ` + s.table + ` WHERE status = 1 AND available_at < ` + s.d.nowMinus
	args := []any{olderThan.Microseconds()}
	if includeDead {
		q = `SELECT COUNT(*) FROM ` + s.table + ` WHERE (status IN (1, 3) OR (status = 4 AND id NOT IN (SELECT event_id FROM ` + s.DeliveriesTable() + `
  WHERE status IN (0, 2) OR done_at >= ` + s.d.nowMinus + `))) AND available_at < ` + s.d.nowMinus
		args = []any{olderThan.Microseconds(), olderThan.Microseconds()}
	}
	var n int64
	if err := s.db.QueryRowContext(ctx, s.rebind(q), args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlstore: cleanup count: %w", s.explainSubs(err))
	}
	return n, nil
}
