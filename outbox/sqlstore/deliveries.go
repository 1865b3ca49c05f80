package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

var _ driver.DeliveryStore = (*Store)(nil)

// SubscriptionsTable returns the quoted name of the table of
// subscriptions: the outbox table's name with "_subscriptions" appended.
func (s *Store) SubscriptionsTable() string { return s.suffixed("_subscriptions") }

// DeliveriesTable returns the quoted name of the table of per-subscription
// delivery state: the outbox table's name with "_deliveries" appended.
func (s *Store) DeliveriesTable() string { return s.suffixed("_deliveries") }

// AttemptsTable returns the quoted name of the table of failed attempts:
// the outbox table's name with "_attempts" appended.
func (s *Store) AttemptsTable() string { return s.suffixed("_attempts") }

// recordAttempts writes the counted failed attempts among the writes of
// splits (a RETRY or DEAD write is one), in INSERTs of up to
// deliveryInsertRows rows.
func (s *Store) recordAttempts(ctx context.Context, tx *sqlx.Tx, splits []driver.EventSplit) error {
	var args []any
	for _, sp := range splits {
		for _, w := range sp.Writes {
			if w.Status == outbox.StatusRetry || w.Status == outbox.StatusDead {
				args = append(args, sp.EventID, w.Subscription, w.Attempts, nullIfEmpty(w.Error))
			}
		}
	}
	for chunk := range slices.Chunk(args, 4*deliveryInsertRows) {
		row := `(?, ?, ?, ` + s.d.now + `, ?)`
		values := strings.TrimSuffix(strings.Repeat(row+", ", len(chunk)/4), ", ")
		if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO `+s.AttemptsTable()+` (event_id, subscription, attempt, at, error) VALUES `+values), chunk...); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) suffixed(suffix string) string {
	return s.table[:len(s.table)-1] + suffix + s.table[len(s.table)-1:]
}

// inTx runs f in a transaction of its own, at READ COMMITTED where the
// dialect has it (so that it takes no gap locks), retrying deadlocks and
// lock-wait timeouts.
func (s *Store) inTx(ctx context.Context, f func(tx *sqlx.Tx) error) error {
	return s.retry(ctx, func() (err error) {
		opts := &sql.TxOptions{}
		if s.d.readCommitted {
			opts.Isolation = sql.LevelReadCommitted
		}
		tx, err := s.db.BeginTxx(ctx, opts)
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			return errors.Join(err, rollback(tx))
		}
		return tx.Commit()
	})
}

// RegistryTable returns the quoted name of the table that holds the
// subscription registry's version (driver.Registration): the outbox
// table's name with "_registry" appended.
func (s *Store) RegistryTable() string { return s.suffixed("_registry") }

// InboxTable returns the quoted name of the inbox table (package inbox):
// the outbox table's name with "_inbox" appended. Migrate creates it.
func (s *Store) InboxTable() string { return s.suffixed("_inbox") }

// InboxFailuresTable returns the quoted name of the table in which the
// inbox counts the failed attempts of messages not yet applied: the
// outbox table's name with "_inbox_failures" appended.
func (s *Store) InboxFailuresTable() string { return s.suffixed("_inbox_failures") }

// regFence is the condition, appended to a completing write's WHERE clause,
// that holds only while the registry's version is the one bound last.
// A statement's read sees every registration committed before the
// statement began (READ COMMITTED takes a snapshot per statement; SQLite
// writes one at a time): see driver.Store.MarkDone.
func (s *Store) regFence() string {
	return ` AND EXISTS (SELECT 1 FROM ` + s.RegistryTable() + ` WHERE id = 1 AND version = ?)`
}

// registryMoved tells a write that changed nothing because the registry moved on
// (it returns driver.ErrRegistryChanged) from one whose leases were lost
// (nil).
func (s *Store) registryMoved(ctx context.Context, q sqlx.QueryerContext, registry int64) error {
	v, err := s.registryVersion(ctx, q)
	if err != nil {
		return err
	}
	if v != registry {
		return fmt.Errorf("registry version %d, not %d: %w", v, registry, driver.ErrRegistryChanged)
	}
	return nil
}

func (s *Store) registryVersion(ctx context.Context, q sqlx.QueryerContext) (int64, error) {
	var v int64
	if err := q.QueryRowxContext(ctx, `SELECT version FROM `+s.RegistryTable()+` WHERE id = 1`).Scan(&v); err != nil {
		if s.d.missingTable(err) {
			return 0, fmt.Errorf("read the registry version: %w (the table %s of migration 005 does not exist: call Store.Migrate at start, or apply migrations/%s/005_registry.sql)", err, s.RegistryTable(), s.d.name)
		}
		return 0, fmt.Errorf("read the registry version: %w", err)
	}
	return v, nil
}

// SyncSubscriptions implements driver.DeliveryStore. The registrations
// run in one transaction, which locks the rows of subs, compares their
// types with what was stored, and increments the registry's version if a
// subscription is new or takes more types (driver.Widens). The version is
// read before the subscriptions, so that it is never newer than them.
func (s *Store) SyncSubscriptions(ctx context.Context, subs []driver.SubscriptionInfo) (driver.Registration, error) {
	if err := s.inTx(ctx, func(tx *sqlx.Tx) error { return s.register(ctx, tx, subs) }); err != nil {
		return driver.Registration{}, s.explainSubs(fmt.Errorf("sqlstore: register subscriptions: %w", err))
	}
	v, err := s.registryVersion(ctx, s.db)
	if err != nil {
		return driver.Registration{}, fmt.Errorf("sqlstore: read subscriptions: %w", err)
	}
	states, err := s.readSubscriptions(ctx)
	return driver.Registration{Version: v, Subscriptions: states}, err
}

// register records subs in tx, incrementing the registry's version if
// one is new or widened.
func (s *Store) register(ctx context.Context, tx *sqlx.Tx, subs []driver.SubscriptionInfo) error {
	if len(subs) == 0 {
		return nil
	}
	t := s.SubscriptionsTable()
	names := make([]any, len(subs))
	for i, sub := range subs {
		names[i] = sub.Name
	}
	lock := ` FOR UPDATE`
	if s.d.name == "sqlite" {
		lock = `` // immediate transactions: one writer at a time
	}
	stored := map[string][]string{}
	rs, err := tx.QueryContext(ctx, s.rebind(`SELECT name, event_types FROM `+t+` WHERE name IN `+in(len(subs))+lock), names...)
	if err != nil {
		return err
	}
	for rs.Next() {
		var name string
		var types sql.NullString
		if err := rs.Scan(&name, &types); err != nil {
			rs.Close()
			return err
		}
		stored[name] = decodeTypes(types)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return err
	}
	upsert := s.rebind(s.upsertSubscriptionSQL())
	bump := false
	for _, sub := range subs {
		prev, known := stored[sub.Name]
		bump = bump || !known || driver.Widens(prev, sub.Types)
		var types any
		if len(sub.Types) > 0 {
			b, err := json.Marshal(sub.Types)
			if err != nil {
				return err
			}
			types = string(b)
		}
		if _, err := tx.ExecContext(ctx, upsert, sub.Name, types, sub.Order); err != nil {
			return fmt.Errorf("subscription %q: %w", sub.Name, err)
		}
	}
	if !bump {
		return nil
	}
	_, err = tx.ExecContext(ctx, `UPDATE `+s.RegistryTable()+` SET version = version + 1 WHERE id = 1`)
	return err
}

// decodeTypes reads a stored event_types; a value that is not a JSON
// array reads as every type (it widens nothing).
func decodeTypes(v sql.NullString) []string {
	var types []string
	if v.Valid && v.String != "" {
		_ = json.Unmarshal([]byte(v.String), &types)
	}
	return types
}

func (s *Store) upsertSubscriptionSQL() string {
	t := s.SubscriptionsTable()
	if s.d.name == "mysql" {
		return `INSERT INTO ` + t + ` (name, event_types, ordering, paused, created_at, seen_at) VALUES (?, ?, ?, 0, ` + s.d.now + `, ` + s.d.now + `)
ON DUPLICATE KEY UPDATE event_types = VALUES(event_types), ordering = VALUES(ordering), seen_at = VALUES(seen_at)`
	}
	return `INSERT INTO ` + t + ` (name, event_types, ordering, paused, created_at, seen_at) VALUES (?, ?, ?, ` + s.d.falseValue() + `, ` + s.d.now + `, ` + s.d.now + `)
ON CONFLICT (name) DO UPDATE SET event_types = excluded.event_types, ordering = excluded.ordering, seen_at = excluded.seen_at`
}

// readSubscriptions returns every subscription the table knows, in name
// order.
func (s *Store) readSubscriptions(ctx context.Context) ([]driver.SubscriptionState, error) {
	t := s.SubscriptionsTable()
	rs, err := s.db.QueryContext(ctx, `SELECT name, event_types, ordering, paused, seen_at, `+s.d.now+` FROM `+t+` ORDER BY name`)
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

// explainSubs adds what to do when the tables of migration 002 are
// missing.
func (s *Store) explainSubs(err error) error {
	if err != nil && s.d.missingTable(err) {
		return fmt.Errorf("%w (the tables %s and %s of migration 002 do not exist: call Store.Migrate at start, or apply migrations/%s/002_subscriptions.sql)", err, s.SubscriptionsTable(), s.DeliveriesTable(), s.d.name)
	}
	return err
}

func (d *Dialect) falseValue() string {
	if d.name == "postgres" {
		return "FALSE"
	}
	return "0"
}

// SetPaused implements driver.DeliveryStore.
func (s *Store) SetPaused(ctx context.Context, name string, paused bool) (bool, error) {
	t := s.SubscriptionsTable()
	if _, err := s.execCount(ctx, s.rebind(`UPDATE `+t+` SET paused = ? WHERE name = ?`), paused, name); err != nil {
		return false, s.explainSubs(fmt.Errorf("sqlstore: pause %q: %w", name, err))
	}
	var n int
	if err := s.db.QueryRowContext(ctx, s.rebind(`SELECT COUNT(*) FROM `+t+` WHERE name = ?`), name).Scan(&n); err != nil {
		return false, fmt.Errorf("sqlstore: pause %q: %w", name, err)
	}
	return n == 1, nil
}

// keysIn returns "(event_id, subscription) IN ((?, ?), …)" for n keys.
func keysIn(n int) string {
	return "(event_id, subscription) IN (" + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ") + ")"
}

func keyArgs(keys []driver.DeliveryID, prefix ...any) []any {
	args := make([]any, 0, len(prefix)+2*len(keys))
	args = append(args, prefix...)
	for _, k := range keys {
		args = append(args, k.EventID, k.Subscription)
	}
	return args
}

// Split implements driver.DeliveryStore: one transaction sets the events
// owner holds among splits' SPLIT, fenced by the registry (splitHeld),
// and writes their deliveries and attempts in multi-row INSERTs.
func (s *Store) Split(ctx context.Context, owner string, splits []driver.EventSplit, registry int64) ([]bool, error) {
	if len(splits) == 0 {
		return nil, nil
	}
	ids := make([]string, len(splits))
	for i := range splits {
		ids[i] = splits[i].EventID
	}
	var mine map[string]bool
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		var err error
		if mine, err = s.splitHeld(ctx, tx, owner, ids, registry); err != nil || len(mine) == 0 {
			return err
		}
		var held []driver.EventSplit
		for _, sp := range splits {
			if mine[sp.EventID] {
				held = append(held, sp)
			}
		}
		if err := s.insertDeliveries(ctx, tx, held); err != nil {
			return err
		}
		return s.recordAttempts(ctx, tx, held)
	})
	if err != nil {
		return nil, s.explainSubs(fmt.Errorf("sqlstore: split %s%s: %w", ids[0], others(len(ids)), err))
	}
	out := make([]bool, len(splits))
	for i, id := range ids {
		out[i] = mine[id]
	}
	return out, nil
}

// others returns " and n-1 other events" for n > 1.
func others(n int) string {
	switch {
	case n == 2:
		return " and 1 other event"
	case n > 2:
		return fmt.Sprintf(" and %d other events", n-1)
	}
	return ""
}

// splitHeld sets the events among ids that owner holds (NEW or RETRY,
// leased to it) SPLIT and free, in tx, if the registry's version is
// registry, and returns their ids; if it is another, it changes nothing
// and returns an error wrapping driver.ErrRegistryChanged. PostgreSQL
// and SQLite say which rows an UPDATE changed (RETURNING); on MySQL the
// rows are locked and read first, in id order.
func (s *Store) splitHeld(ctx context.Context, tx *sqlx.Tx, owner string, ids []string, registry int64) (map[string]bool, error) {
	const set = ` SET status = 4, done_at = NULL, locked_by = NULL, locked_until = NULL WHERE id`
	held := func(ids []string) string {
		return s.idIn(len(ids)) + ` AND locked_by = ? AND ` + s.d.statusByID() + ` IN (0, 2)`
	}
	if s.d.name != "mysql" {
		q := s.rebind(s.q.update + set + held(ids) + s.regFence() + ` RETURNING id`)
		changed, err := readIDs(ctx, tx, q, append(s.idArgs(ids), owner, registry)...)
		if err != nil || len(changed) > 0 {
			return idSet(changed), err
		}
		return nil, s.registryMoved(ctx, tx, registry)
	}
	q := s.rebind(`SELECT id FROM ` + s.table + s.d.byID + ` WHERE id` + held(ids) + ` ORDER BY id` + s.d.rowLock)
	locked, err := readIDs(ctx, tx, q, append(s.idArgs(ids), owner)...)
	if err != nil || len(locked) == 0 {
		if err == nil {
			err = s.registryMoved(ctx, tx, registry)
		}
		return nil, err
	}
	n, err := execN(ctx, tx, s.rebind(s.q.update+set+s.idIn(len(locked))+s.regFence()), append(s.idArgs(locked), registry)...)
	if err == nil && n != len(locked) {
		if err = s.registryMoved(ctx, tx, registry); err == nil {
			err = fmt.Errorf("changed %d of the %d events it locked", n, len(locked))
		}
	}
	return idSet(locked), err
}

func idSet(ids []string) map[string]bool {
	set := make(map[string]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	return set
}

// deliveryInsertRows bounds the rows of one INSERT of deliveries (7
// arguments each): well under the 65,535 placeholders of MySQL and
// PostgreSQL and the 32,766 of SQLite.
const deliveryInsertRows = 1000

// insertDeliveries writes the deliveries of splits, NEW, RETRY or DEAD as
// each write says, due after its delay: on PostgreSQL in one statement
// (insertDeliveryArrays), elsewhere in multi-row INSERTs of up to
// deliveryInsertRows rows.
func (s *Store) insertDeliveries(ctx context.Context, tx *sqlx.Tx, splits []driver.EventSplit) error {
	if s.d.name == "postgres" {
		return s.insertDeliveryArrays(ctx, tx, splits)
	}
	type row struct {
		id string
		w  driver.DeliveryWrite
	}
	var rows []row
	for _, sp := range splits {
		for _, w := range sp.Writes {
			rows = append(rows, row{sp.EventID, w})
		}
	}
	for chunk := range slices.Chunk(rows, deliveryInsertRows) {
		var sb strings.Builder
		sb.WriteString(`INSERT INTO ` + s.DeliveriesTable() + ` (event_id, subscription, status, attempts, available_at, created_at, done_at, last_error) VALUES `)
		args := make([]any, 0, 7*len(chunk))
		for i, r := range chunk {
			if i > 0 {
				sb.WriteString(", ")
			}
			sb.WriteString(`(?, ?, ?, ?, ` + s.d.nowPlus + `, ` + s.d.now + `, CASE WHEN ? = 3 THEN ` + s.d.now + ` END, ?)`)
			args = append(args, r.id, r.w.Subscription, int(r.w.Status), r.w.Attempts, max(0, r.w.Delay).Microseconds(), int(r.w.Status), nullIfEmpty(r.w.Error))
		}
		if _, err := tx.ExecContext(ctx, s.rebind(sb.String()), args...); err != nil {
			return err
		}
	}
	return nil
}

// insertDeliveryArrays is insertDeliveries on PostgreSQL: each column of the rows is bound as one array, unnested
// into the rows. The statement's text is the same however many rows it
// writes, so it is prepared and planned once, where a multi-row VALUES
// of 7 placeholders a row was prepared and planned again for every new
// row count: a split of deferred events went from 0.80 to 0.97 of the
// drain beside it (BENCHMARKS.md, "Rate limit").
func (s *Store) insertDeliveryArrays(ctx context.Context, tx *sqlx.Tx, splits []driver.EventSplit) error {
	var ids, subs, errs []string
	var status, attempts []int32
	var delays []int64
	for _, sp := range splits {
		for _, w := range sp.Writes {
			ids, subs, errs = append(ids, sp.EventID), append(subs, w.Subscription), append(errs, w.Error)
			status, attempts = append(status, int32(w.Status)), append(attempts, int32(w.Attempts))
			delays = append(delays, max(0, w.Delay).Microseconds())
		}
	}
	q := `INSERT INTO ` + s.DeliveriesTable() + ` (event_id, subscription, status, attempts, available_at, created_at, done_at, last_error)
SELECT e, sub, st, a, ` + s.d.now + ` + delay * INTERVAL '1 microsecond', ` + s.d.now + `, CASE WHEN st = 3 THEN ` + s.d.now + ` END, NULLIF(err, '')
FROM unnest(?::text[], ?::text[], ?::smallint[], ?::integer[], ?::bigint[], ?::text[]) AS t(e, sub, st, a, delay, err)`
	_, err := tx.ExecContext(ctx, s.rebind(q), ids, subs, status, attempts, delays, errs)
	return err
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// ClaimDeliveries implements driver.DeliveryStore: like Claim, one short
// transaction selects due deliveries of the given subscriptions with FOR
// UPDATE SKIP LOCKED (retries first, up to a quarter of the batch), leases
// them, and reads their events. A delivery to an ordered subscription of
// an event numbered in its key waits while an earlier event of the key is
// pending for that subscription (owesSQL).
func (s *Store) ClaimDeliveries(ctx context.Context, req driver.ClaimRequest, subs []string, f driver.OrderFilter) ([]driver.Delivery, error) {
	if req.Limit <= 0 || len(subs) == 0 {
		return nil, nil
	}
	var out []driver.Delivery
	var keys []driver.DeliveryID
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		out, keys = out[:0], keys[:0]
		var picks []pickedDelivery
		for _, st := range []struct {
			status, limit int
		}{{2, max(1, req.Limit/4)}, {0, req.Limit}} {
			limit := min(st.limit, req.Limit-len(picks))
			if limit <= 0 {
				continue
			}
			owes, oargs := s.owesSQL("d", subs, f)
			q := `SELECT d.event_id, d.subscription, d.status, d.attempts, d.locked_by FROM ` + s.DeliveriesTable() + ` d
WHERE d.status = ? AND d.subscription IN ` + in(len(subs)) + ` AND d.available_at <= ` + s.nowBound() + `
  AND (d.locked_until IS NULL OR d.locked_until <= ` + s.d.now + `)` + owes + `
ORDER BY d.available_at LIMIT ?`
			args := append(append(stringArgs(subs, st.status), oargs...), limit)
			if s.d.name == "mysql" {
				// InnoDB's locking read locks every row its range scan
				// examines, those it then rejects too (leased, or not their
				// turn), until the WHERE is decided (READ COMMITTED) or the
				// transaction ends (REPEATABLE READ), holding up the lease
				// renewals and outcomes of other instances. So the rows are
				// found by a plain read, then locked by primary key, where
				// the whole WHERE is decided again.
				cand, err := s.deliveryKeys(ctx, tx, s.bounded(ctx, q), args)
				if err != nil || len(cand) == 0 {
					if err != nil {
						return err
					}
					continue
				}
				q = `SELECT d.event_id, d.subscription, d.status, d.attempts, d.locked_by FROM ` + s.DeliveriesTable() + ` d` + s.d.byID + `
WHERE ` + keysIn(len(cand)) + ` AND d.status = ? AND d.available_at <= ` + s.d.now + `
  AND (d.locked_until IS NULL OR d.locked_until <= ` + s.d.now + `)` + owes + `
ORDER BY d.available_at`
				args = append(append(keyArgs(cand), st.status), oargs...)
			}
			rs, err := tx.QueryContext(ctx, s.rebind(q+s.d.lock), args...)
			if err != nil {
				return err
			}
			for rs.Next() {
				var p pickedDelivery
				if err := rs.Scan(&p.key.EventID, &p.key.Subscription, &p.status, &p.attempts, &p.owner); err != nil {
					rs.Close()
					return err
				}
				picks = append(picks, p)
			}
			if err := errors.Join(rs.Err(), rs.Close()); err != nil {
				return err
			}
		}
		if len(picks) == 0 {
			return nil
		}
		for _, p := range picks {
			keys = append(keys, p.key)
		}
		var err error
		if out, err = s.leaseDeliveries(ctx, tx, req, picks); err != nil {
			return err
		}
		var more []driver.DeliveryID
		out, more, err = s.deliveryRuns(ctx, tx, req, f, out)
		keys = append(keys, more...)
		return err
	})
	if err != nil {
		if len(keys) > 0 && ctx.Err() != nil {
			// The commit's outcome is unknown: hand the deliveries back.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if rerr := s.ReleaseDeliveries(rctx, req.Owner, keys, 0); rerr != nil {
				err = errors.Join(err, fmt.Errorf("release after a failed commit: %w", rerr))
			}
		}
		return nil, s.explainSubs(fmt.Errorf("sqlstore: claim deliveries: %w", err))
	}
	return out, nil
}

// deliveryRuns leases to req.Owner, behind each delivery of out to an
// ordered subscription of f (a head), the deliveries to that subscription
// of the events that follow its event in its key, numbered one after
// another, each split with that delivery NEW or RETRY, due and free
// (req.Run shared evenly over the heads), and appends them to out, each
// key's in number order after its head. It returns the deliveries it
// leased. One read of the heads' keys per subscription, then a locking
// read and a lease of the runs' deliveries by primary key.
func (s *Store) deliveryRuns(ctx context.Context, tx *sqlx.Tx, req driver.ClaimRequest, f driver.OrderFilter, out []driver.Delivery) ([]driver.Delivery, []driver.DeliveryID, error) {
	heads := map[string][]runHead{} // by subscription
	n := 0
	for _, d := range out {
		if d.KeySeq > 0 && f.Ordered(d.Subscription) {
			heads[d.Subscription] = append(heads[d.Subscription], runHead{d.OrderingKey, d.KeySeq})
			n++
		}
	}
	if req.Run <= 0 || n == 0 || req.Run/n == 0 {
		return out, nil, nil
	}
	per := int64(req.Run / n)
	var runs [][]driver.DeliveryID // each head's, in order
	for _, sub := range slices.Sorted(maps.Keys(heads)) {
		r, err := s.subscriptionRuns(ctx, tx, sub, heads[sub], per)
		if err != nil {
			return out, nil, err
		}
		runs = append(runs, r...)
	}
	picks, leased, err := s.lockRuns(ctx, tx, runs)
	if err != nil || len(picks) == 0 {
		return out, nil, err
	}
	more, err := s.leaseDeliveries(ctx, tx, req, picks)
	return append(out, more...), leased, err
}

// runHead is a delivery claimed to an ordered subscription: its event's
// key and number.
type runHead struct {
	key string
	seq int64
}

// subscriptionRuns returns, for each of hs (the heads claimed to sub),
// the deliveries to sub of the events that follow it in its key, numbered
// one after another, each split with that delivery NEW or RETRY, due and
// free, per at most: one read of every pending event of the heads' keys
// in the runs' reach.
func (s *Store) subscriptionRuns(ctx context.Context, tx *sqlx.Tx, sub string, hs []runHead, per int64) ([][]driver.DeliveryID, error) {
	keys := make([]string, 0, len(hs))
	lo, hi := hs[0].seq, hs[0].seq
	for _, h := range hs {
		keys = append(keys, h.key)
		lo, hi = min(lo, h.seq), max(hi, h.seq)
	}
	// A run stops at the first event that is not split with sub's
	// delivery free to go.
	q := `SELECT o.ordering_key, o.key_seq, o.id, o.status, COALESCE(e.status, -1),
  CASE WHEN e.locked_until > ` + s.d.now + ` THEN 1 WHEN e.available_at > ` + s.d.now + ` THEN 2 ELSE 0 END
FROM ` + s.table + ` o` + s.byKey() + ` LEFT JOIN ` + s.DeliveriesTable() + ` e ON e.event_id = o.id AND e.subscription = ?
WHERE o.status IN (0, 2, 3, 4) AND o.ordering_key IN ` + in(len(keys)) + ` AND o.key_seq > ? AND o.key_seq <= ?
ORDER BY o.ordering_key, o.key_seq`
	rs, err := tx.QueryContext(ctx, s.rebind(q), append(stringArgs(keys, sub), lo, hi+per)...)
	if err != nil {
		return nil, err
	}
	type pend struct {
		seq int64
		id  string
		ok  bool // split, with sub's delivery NEW or RETRY, due and free
	}
	byKey := map[string][]pend{}
	for rs.Next() {
		var k, id string
		var seq int64
		var st, dst, busy int
		if err := rs.Scan(&k, &seq, &id, &st, &dst, &busy); err != nil {
			rs.Close()
			return nil, err
		}
		byKey[k] = append(byKey[k], pend{seq, id, st == 4 && (dst == 0 || dst == 2) && busy == 0})
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, err
	}
	var runs [][]driver.DeliveryID
	for _, h := range hs {
		var run []driver.DeliveryID
		seq := h.seq
		for _, p := range byKey[h.key] {
			if p.seq <= h.seq {
				continue
			}
			if int64(len(run)) == per || p.seq != seq+1 || !p.ok {
				break
			}
			run = append(run, driver.DeliveryID{EventID: p.id, Subscription: sub})
			seq = p.seq
		}
		if len(run) > 0 {
			runs = append(runs, run)
		}
	}
	return runs, nil
}

// lockRuns locks the deliveries of runs that are still due and free
// (another instance cannot lease them meanwhile: each owes its head,
// leased here), cuts each run at the first one not taken, and returns
// them as picked, and their keys.
func (s *Store) lockRuns(ctx context.Context, tx *sqlx.Tx, runs [][]driver.DeliveryID) ([]pickedDelivery, []driver.DeliveryID, error) {
	var all []driver.DeliveryID
	for _, r := range runs {
		all = append(all, r...)
	}
	if len(all) == 0 {
		return nil, nil, nil
	}
	got := map[driver.DeliveryID]pickedDelivery{}
	rs, err := tx.QueryContext(ctx, s.rebind(`SELECT d.event_id, d.subscription, d.status, d.attempts, d.locked_by FROM `+s.DeliveriesTable()+` d`+s.d.byID+`
WHERE `+keysIn(len(all))+` AND d.status IN (0, 2) AND d.available_at <= `+s.d.now+`
  AND (d.locked_until IS NULL OR d.locked_until <= `+s.d.now+`)`+s.d.lock), keyArgs(all)...)
	if err != nil {
		return nil, nil, err
	}
	for rs.Next() {
		var p pickedDelivery
		if err := rs.Scan(&p.key.EventID, &p.key.Subscription, &p.status, &p.attempts, &p.owner); err != nil {
			rs.Close()
			return nil, nil, err
		}
		got[p.key] = p
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, nil, err
	}
	var picks []pickedDelivery
	var leased []driver.DeliveryID
	for _, r := range runs {
		for _, k := range r {
			p, ok := got[k]
			if !ok {
				break
			}
			picks, leased = append(picks, p), append(leased, k)
		}
	}
	return picks, leased, nil
}

// pickedDelivery is a delivery as a claim's locking read found it.
type pickedDelivery struct {
	key              driver.DeliveryID
	status, attempts int
	owner            sql.NullString
}

// leaseDeliveries leases picks to req.Owner and returns them with their
// events' rows, in the order of picks (one whose event was deleted by
// hand is left out: nothing to deliver).
func (s *Store) leaseDeliveries(ctx context.Context, tx *sqlx.Tx, req driver.ClaimRequest, picks []pickedDelivery) ([]driver.Delivery, error) {
	keys := make([]driver.DeliveryID, len(picks))
	ids := make([]string, 0, len(picks))
	seen := map[string]bool{}
	for i, p := range picks {
		keys[i] = p.key
		if !seen[p.key.EventID] {
			seen[p.key.EventID] = true
			ids = append(ids, p.key.EventID)
		}
	}
	if _, err := tx.ExecContext(ctx, s.rebind(`UPDATE `+s.DeliveriesTable()+s.d.byID+` SET locked_by = ?, locked_until = `+s.d.nowPlus+` WHERE `+keysIn(len(keys))),
		keyArgs(keys, req.Owner, req.Lease.Microseconds())...); err != nil {
		return nil, err
	}
	rs, err := tx.QueryContext(ctx, s.rebind(`SELECT `+rowColumns+` FROM `+s.table+` WHERE id IN `+in(len(ids))), stringArgs(ids)...)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]*driver.Row, len(ids))
	for rs.Next() {
		r, err := scanRow(rs)
		if err != nil {
			rs.Close()
			return nil, err
		}
		byID[r.ID] = &r
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return nil, err
	}
	out := make([]driver.Delivery, 0, len(picks))
	for _, p := range picks {
		r, ok := byID[p.key.EventID]
		if !ok {
			continue
		}
		d := driver.Delivery{Row: *r, Subscription: p.key.Subscription}
		d.Status, d.Attempts = outbox.Status(p.status), p.attempts
		if p.owner.Valid && p.owner.String != req.Owner {
			d.PrevOwner = p.owner.String
		}
		out = append(out, d)
	}
	return out, nil
}

// deliveryKeys runs q, a plain read whose first two columns are a
// delivery's key, and returns the keys.
func (s *Store) deliveryKeys(ctx context.Context, tx *sqlx.Tx, q string, args []any) ([]driver.DeliveryID, error) {
	rs, err := tx.QueryContext(ctx, s.rebind(q), args...)
	if err != nil {
		return nil, err
	}
	var out []driver.DeliveryID
	for rs.Next() {
		var k driver.DeliveryID
		var status, attempts int
		var owner sql.NullString
		if err := rs.Scan(&k.EventID, &k.Subscription, &status, &attempts, &owner); err != nil {
			rs.Close()
			return nil, err
		}
		out = append(out, k)
	}
	return out, errors.Join(rs.Err(), rs.Close())
}

// CompleteDeliveries implements driver.DeliveryStore.
func (s *Store) CompleteDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	var n int64
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, s.rebind(`UPDATE `+s.DeliveriesTable()+s.d.byID+s.setDone()+`
WHERE locked_by = ? AND status IN (0, 2) AND `+keysIn(len(keys))), keyArgs(keys, owner)...)
		if err != nil {
			return err
		}
		if n, err = res.RowsAffected(); err != nil {
			return err
		}
		return s.finishSplit(ctx, tx, owner, eventIDs(keys))
	})
	if err != nil {
		return 0, fmt.Errorf("sqlstore: complete deliveries: %w", err)
	}
	return int(n), nil
}

func eventIDs(keys []driver.DeliveryID) []string {
	ids := make([]string, 0, len(keys))
	seen := map[string]bool{}
	for _, k := range keys {
		if !seen[k.EventID] {
			seen[k.EventID] = true
			ids = append(ids, k.EventID)
		}
	}
	return ids
}

// FailDelivery implements driver.DeliveryStore: one UPDATE, and the
// attempt's record if it counts, in one transaction.
func (s *Store) FailDelivery(ctx context.Context, owner string, key driver.DeliveryID, w driver.DeliveryWrite) (bool, error) {
	q := s.rebind(`UPDATE ` + s.DeliveriesTable() + s.d.byID + ` SET status = ?, attempts = ?, available_at = ` + s.d.nowPlus + `,
  done_at = CASE WHEN ? = 3 THEN ` + s.d.now + ` END, last_error = COALESCE(?, last_error), locked_by = NULL, locked_until = NULL
WHERE event_id = ? AND subscription = ? AND locked_by = ? AND status IN (0, 2)`)
	held := false
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, q, int(w.Status), w.Attempts, max(0, w.Delay).Microseconds(), int(w.Status), nullIfEmpty(w.Error), key.EventID, key.Subscription, owner)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if held = n == 1; err != nil || !held {
			return err
		}
		return s.recordAttempts(ctx, tx, []driver.EventSplit{{EventID: key.EventID, Writes: []driver.DeliveryWrite{{Subscription: key.Subscription, Status: w.Status, Attempts: w.Attempts, Error: w.Error}}}})
	})
	if err != nil {
		return false, fmt.Errorf("sqlstore: record delivery %s to %q: %w", key.EventID, key.Subscription, err)
	}
	return held, nil
}

// ExtendDeliveryLeases implements driver.DeliveryStore.
func (s *Store) ExtendDeliveryLeases(ctx context.Context, owner string, keys []driver.DeliveryID, lease time.Duration) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	q := s.rebind(`UPDATE ` + s.DeliveriesTable() + s.d.byID + ` SET locked_until = ` + s.d.nowPlus + ` WHERE locked_by = ? AND status IN (0, 2) AND ` + keysIn(len(keys)))
	return s.execCount(ctx, q, keyArgs(keys, lease.Microseconds(), owner)...)
}

// ReleaseDeliveries implements driver.DeliveryStore.
func (s *Store) ReleaseDeliveries(ctx context.Context, owner string, keys []driver.DeliveryID, delay time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	set := ` SET locked_by = NULL, locked_until = NULL`
	args := []any{}
	if delay > 0 {
		set += `, available_at = ` + s.d.nowPlus
		args = append(args, delay.Microseconds())
	}
	q := s.rebind(`UPDATE ` + s.DeliveriesTable() + s.d.byID + set + ` WHERE locked_by = ? AND status IN (0, 2) AND ` + keysIn(len(keys)))
	_, err := s.execCount(ctx, q, keyArgs(keys, append(args, owner)...)...)
	return err
}

var _ driver.TxDeliveryStore = (*Store)(nil)

// DeliverInTx implements driver.TxDeliveryStore. The delivery's row is the
// guard: it is inserted DONE (or updated to DONE) in f's transaction, so
// of two instances running the same delivery at once, the second waits on
// the first's row lock and then finds it DONE, and rolls back its own
// effects. A transaction the database gives up on (a deadlock, a lock
// wait timeout, a serialization failure), which under load happens to the
// record's INSERT after f succeeded, is run again from the start, f
// included, a few times: the database's failure is not the handler's, and
// must not spend one of its attempts.
func (s *Store) DeliverInTx(ctx context.Context, owner string, at driver.TxTurn, eventID, sub string, f func(tx outbox.DBTx) error) (already bool, err error) {
	err = s.retry(ctx, func() error {
		var err error
		already, err = s.deliverInTx(ctx, owner, at, eventID, sub, f)
		return err
	})
	return already, err
}

func (s *Store) deliverInTx(ctx context.Context, owner string, at driver.TxTurn, eventID, sub string, f func(tx outbox.DBTx) error) (already bool, err error) {
	opts := &sql.TxOptions{}
	if s.d.readCommitted {
		opts.Isolation = sql.LevelReadCommitted
	}
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return false, fmt.Errorf("sqlstore: deliver in a transaction: begin: %w", err)
	}
	defer tx.Rollback() // after Commit: a no-op
	if done, err := s.txTurn(ctx, tx, owner, at, eventID, sub); done || err != nil {
		return done, err
	}
	if err := f(tx); err != nil {
		return false, err
	}
	if done, err := s.recordTxDelivery(ctx, tx, owner, at, eventID, sub); done || err != nil {
		return done, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("sqlstore: deliver in a transaction: commit: %w", err)
	}
	return false, nil
}

// txTurn reads sub's delivery of eventID in tx: done if it is recorded
// DONE, driver.ErrLeaseLost if owner's turn at with it is over.
func (s *Store) txTurn(ctx context.Context, tx *sql.Tx, owner string, at driver.TxTurn, eventID, sub string) (done bool, err error) {
	var status, attempts int
	var by sql.NullString
	err = tx.QueryRowContext(ctx, s.rebind(`SELECT status, attempts, locked_by FROM `+s.DeliveriesTable()+` WHERE event_id = ? AND subscription = ?`), eventID, sub).Scan(&status, &attempts, &by)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if at.Whole {
			return false, nil
		}
		return false, driver.ErrLeaseLost
	case err != nil:
		return false, s.explainSubs(fmt.Errorf("sqlstore: deliver in a transaction: %w", err))
	case status == int(outbox.StatusDone):
		return true, nil
	case at.Whole, by.String != owner, attempts != at.Attempts, status != int(outbox.StatusNew) && status != int(outbox.StatusRetry):
		return false, driver.ErrLeaseLost
	}
	return false, nil
}

// recordTxDelivery records sub's delivery of eventID DONE in tx, in
// owner's turn at (the event DONE too if that was its last delivery
// left): an insert on the whole event, an update of the delivery leased
// to owner with at.Attempts otherwise. done if it was recorded already;
// driver.ErrLeaseLost if the turn ended meanwhile.
func (s *Store) recordTxDelivery(ctx context.Context, tx *sql.Tx, owner string, at driver.TxTurn, eventID, sub string) (done bool, err error) {
	var res sql.Result
	if at.Whole {
		insert := `INSERT INTO ` + s.DeliveriesTable() + ` (event_id, subscription, status, attempts, available_at, created_at, done_at) VALUES (?, ?, 1, 0, ` + s.d.now + `, ` + s.d.now + `, ` + s.d.now + `)
ON CONFLICT (event_id, subscription) DO NOTHING`
		if s.d.name == "mysql" {
			insert = `INSERT INTO ` + s.DeliveriesTable() + ` (event_id, subscription, status, attempts, available_at, created_at, done_at) VALUES (?, ?, 1, 0, ` + s.d.now + `, ` + s.d.now + `, ` + s.d.now + `)
ON DUPLICATE KEY UPDATE event_id = event_id`
		}
		res, err = tx.ExecContext(ctx, s.rebind(insert), eventID, sub)
	} else {
		res, err = tx.ExecContext(ctx, s.rebind(`UPDATE `+s.DeliveriesTable()+s.d.byID+s.setDone()+`
WHERE event_id = ? AND subscription = ? AND status IN (0, 2) AND locked_by = ? AND attempts = ?`), eventID, sub, owner, at.Attempts)
	}
	if err != nil {
		return false, fmt.Errorf("sqlstore: deliver in a transaction: record: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		// A row written meanwhile: recorded by another, or the turn over.
		return s.txTurn(ctx, tx, owner, driver.TxTurn{Attempts: -1}, eventID, sub)
	}
	if at.Whole {
		return false, nil
	}
	if err := s.finishSplit(ctx, tx, owner, []string{eventID}); err != nil {
		return false, fmt.Errorf("sqlstore: deliver in a transaction: complete the event: %w", err)
	}
	return false, nil
}

// finishSplit completes, through tx, those of the split events ids none
// of whose deliveries is left to do (their last ones were just written
// DONE in tx): DONE, or into the archive (Options.ArchiveDelivered) as
// delivered by owner.
//
// It locks the events' rows first (lockEvents). Without that, two
// transactions writing the last two deliveries of one event at once each
// read the other's delivery as still to do (at READ COMMITTED a statement
// sees what was committed when it began, and the other had not
// committed), and neither completed the event: it stayed split for good.
// Locked, the second waits for the first to commit, and its next
// statement sees both deliveries done.
func (s *Store) finishSplit(ctx context.Context, tx archiveExec, owner string, ids []string) error {
	if err := s.lockEvents(ctx, tx, ids); err != nil {
		return err
	}
	if s.arch {
		return s.archiveFinished(ctx, tx, owner, ids)
	}
	_, err := tx.ExecContext(ctx, s.rebind(s.q.update+` SET status = 1, done_at = `+s.d.now+`
WHERE status = 4 AND id IN `+in(len(ids))+` AND id NOT IN (SELECT event_id FROM `+s.DeliveriesTable()+` WHERE status <> 1 AND event_id IN `+in(len(ids))+`)`),
		append(stringArgs(ids), stringArgs(ids)...)...)
	return err
}

// lockEvents locks the rows of the events ids in tx, in id order (so
// that two transactions locking some of the same rows wait for each
// other instead of deadlocking), on the dialects with row locks; SQLite's
// write transaction holds the whole database already.
func (s *Store) lockEvents(ctx context.Context, tx archiveExec, ids []string) error {
	if s.d.rowLock == "" || len(ids) == 0 {
		return nil
	}
	rows, err := tx.QueryContext(ctx, s.rebind(`SELECT id FROM `+s.table+s.d.byID+` WHERE id IN `+in(len(ids))+` ORDER BY id`+s.d.rowLock), stringArgs(ids)...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	return errors.Join(rows.Err(), rows.Close())
}

// DueNow implements driver.DeliveryStore.
func (s *Store) DueNow(ctx context.Context, sub string) (int, error) {
	q := s.rebind(`UPDATE ` + s.DeliveriesTable() + ` SET available_at = ` + s.d.now + `
WHERE status = 0 AND subscription = ? AND locked_by IS NULL AND available_at > ` + s.nowBound())
	n, err := s.execCount(ctx, q, sub)
	if err != nil {
		return n, fmt.Errorf("sqlstore: make the deliveries of %q due: %w", sub, err)
	}
	return n, nil
}
