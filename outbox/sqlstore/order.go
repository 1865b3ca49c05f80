package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Per-key ordering (driver.OrderedStore). Each ordered event carries its
// key (ordering_key) and its number in the key's sequence (key_seq),
// taken from the key's row in <table>_keys by the publishing transaction,
// which keeps that row locked until it ends: publishers of one key commit
// in sequence order. Only a key's head, its earliest event still pending
// for an ordered subscription, is ever leased, or events behind it to the
// instance that holds it (Row.KeyAfter when publishing, a run of
// ClaimHeads), which delivers each once the one before it succeeded: two
// events of one key are never delivered at once, here or on two
// instances.

var _ driver.OrderedStore = (*Store)(nil)

// byKey follows the outbox table (and its alias) in the queries that look
// events up by ordering key: on MySQL the optimizer otherwise may take the
// (status, available_at) index for the status list and read every pending
// event of every key.
func (s *Store) byKey() string {
	if s.d.name == "mysql" {
		return ` FORCE INDEX (` + s.d.quote(s.name+"_key_seq") + `)`
	}
	return ""
}

// KeysTable returns the quoted name of the table of ordering keys: the
// outbox table's name with "_keys" appended.
func (s *Store) KeysTable() string { return s.suffixed("_keys") }

// Tables returns the quoted names of every table the store uses: the
// outbox table, its schema versions, subscriptions, deliveries, attempts
// and ordering keys, the registry, the inbox's two tables and the archive.
func (s *Store) Tables() []string {
	return []string{s.table, s.SchemaTable(), s.SubscriptionsTable(), s.DeliveriesTable(), s.AttemptsTable(), s.KeysTable(), s.RegistryTable(),
		s.InboxTable(), s.InboxFailuresTable(), s.ArchiveTable()}
}

// MaxOrderingKeyLen is the longest ordering key the table holds, in
// bytes.
const MaxOrderingKeyLen = 255

// pending returns the condition that the row aliased p, an ordered event
// of one of keys, is pending under f, and its parameters. The status list
// comes first so that the (status, ordering_key, key_seq) index serves
// it.
func (s *Store) pending(p string, f driver.OrderFilter, keys ...string) (string, []any) {
	state, args := s.pendingState(p, f)
	return p + `.status IN (0, 2, 3, 4) AND ` + p + `.ordering_key` + keyIs(len(keys)) + ` AND ` + p + `.key_seq IS NOT NULL AND ` + state, append(stringArgs(keys), args...)
}

// keyIs returns the condition, after a column, that it is one of n
// parameters: "= ?" for one, an IN list for more.
func keyIs(n int) string {
	if n > 1 {
		return ` IN ` + in(n)
	}
	return ` = ?`
}

// pendingState returns the condition that the row aliased p is pending
// under f, whatever its key, and its parameters.
func (s *Store) pendingState(p string, f driver.OrderFilter) (string, []any) {
	var sb strings.Builder
	var args []any
	sb.WriteString(`(` + p + `.status IN (0, 2`)
	if len(f.Block) > 0 {
		sb.WriteString(`, 3`)
	}
	sb.WriteString(`)`)
	var ds []string
	if len(f.Block) > 0 {
		ds = append(ds, `(d.subscription IN `+in(len(f.Block))+` AND d.status IN (0, 2, 3))`)
		args = stringArgs(f.Block, args...)
	}
	if len(f.Skip) > 0 {
		ds = append(ds, `(d.subscription IN `+in(len(f.Skip))+` AND d.status IN (0, 2))`)
		args = stringArgs(f.Skip, args...)
	}
	if len(ds) > 0 {
		sb.WriteString(` OR (` + p + `.status = 4 AND EXISTS (SELECT 1 FROM ` + s.DeliveriesTable() + ` d WHERE d.event_id = ` + p + `.id AND (` + strings.Join(ds, ` OR `) + `)))`)
	}
	sb.WriteString(`)`)
	return sb.String(), args
}

// owesSQL returns, for a query over the deliveries aliased d, the
// condition (starting with AND) that d is not a delivery to an ordered
// subscription among subs that owes an earlier event of its key: an
// earlier event NEW or RETRY as a whole, DEAD as a whole (blocking
// subscriptions), or split with a delivery to d's subscription NEW or
// RETRY (or DEAD, blocking). "" if f orders none of subs.
func (s *Store) owesSQL(d string, subs []string, f driver.OrderFilter) (string, []any) {
	var ordered, block []string
	for _, sub := range subs {
		if f.Ordered(sub) {
			ordered = append(ordered, sub)
		}
		if f.Blocks(sub) {
			block = append(block, sub)
		}
	}
	if len(ordered) == 0 {
		return "", nil
	}
	// Each status is looked up on its own, by the (status, ordering_key,
	// key_seq) index with both leading columns equal: a status list
	// against the key of the outer row makes MariaDB scan the index by
	// status alone, every pending event of every key once per candidate
	// delivery (a claim of thousands of deliveries held behind their
	// keys' heads then ran for minutes).
	args := stringArgs(ordered)
	earlier := func(status string) string {
		return ` OR EXISTS (SELECT 1 FROM ` + s.table + ` p` + s.byKey() + ` WHERE p.status = ` + status + ` AND p.ordering_key = o.ordering_key AND p.key_seq IS NOT NULL AND p.id <> o.id
        AND (p.key_seq < o.key_seq OR p.locked_until > ` + s.d.now + `))`
	}
	dead, deadDelivery := "", ""
	if len(block) > 0 {
		dead = `
      OR (` + d + `.subscription IN ` + in(len(block)) + ` AND EXISTS (SELECT 1 FROM ` + s.table + ` p` + s.byKey() + ` WHERE p.status = 3 AND p.ordering_key = o.ordering_key AND p.key_seq IS NOT NULL AND p.key_seq < o.key_seq))`
		deadDelivery = ` OR (e.status = 3 AND e.subscription IN ` + in(len(block)) + `)`
		args = stringArgs(block, args...)
		args = stringArgs(block, args...)
	}
	// Nor while another event of the key is in flight to it: leased as a
	// whole, or its delivery to the subscription leased (a later one,
	// when this one was replayed). The checks most often true come first
	// (OR stops at the first true one): behind a split event, the shape
	// of a key's backlog after a failure, then behind a whole one; a dead
	// event last.
	return `
  AND NOT (` + d + `.subscription IN ` + in(len(ordered)) + ` AND EXISTS (SELECT 1 FROM ` + s.table + ` o WHERE o.id = ` + d + `.event_id AND o.key_seq IS NOT NULL AND (
      EXISTS (SELECT 1 FROM ` + s.table + ` p` + s.byKey() + ` JOIN ` + s.DeliveriesTable() + ` e ON e.event_id = p.id AND e.subscription = ` + d + `.subscription
        WHERE p.status = 4 AND p.ordering_key = o.ordering_key AND p.key_seq IS NOT NULL AND p.id <> o.id AND (
          (p.key_seq < o.key_seq AND (e.status IN (0, 2)` + deadDelivery + `))
          OR (e.status IN (0, 2) AND e.locked_until > ` + s.d.now + `)))` + earlier("0") + earlier("2") + dead + `)))`, args
}

// KeysDone implements driver.OrderedStore: it reads which of the events
// are no longer pending, then advances their keys' done_seq in a short
// transaction, passing over the keys a publishing transaction holds
// (FOR UPDATE SKIP LOCKED): it never waits for the application.
func (s *Store) KeysDone(ctx context.Context, evs []driver.KeyDone, f driver.OrderFilter) error {
	if len(evs) == 0 {
		return nil
	}
	done := map[string]int64{}
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	if err := s.doneOf(ctx, ids, evs, f, done); err != nil {
		return err
	}
	if err := s.capDone(ctx, f, done); err != nil {
		return err
	}
	if len(done) == 0 {
		return nil
	}
	return s.explain(s.inTx(ctx, func(tx *sqlx.Tx) error {
		_, err := s.advanceKeys(ctx, tx, done)
		return err
	}))
}

// MarkDoneKeys implements driver.OrderedStore: MarkDone and, in the same
// transaction (one commit), the keys' record of evs if every id changed.
func (s *Store) MarkDoneKeys(ctx context.Context, owner string, ids []string, evs []driver.KeyDone, registry int64) (int, []string, error) {
	if len(ids) == 0 {
		return 0, nil, nil
	}
	done := map[string]int64{}
	for _, ev := range evs {
		if ev.Seq > 0 && ev.Key != "" {
			done[ev.Key] = max(done[ev.Key], ev.Seq)
		}
	}
	var n int
	var later []string
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		later = later[:0]
		m, err := s.markDoneTx(ctx, tx, owner, ids, registry)
		if err != nil {
			return err
		}
		if m == 0 {
			if err := s.registryMoved(ctx, tx, registry); err != nil {
				return err
			}
		}
		if n = m; n != len(ids) || len(done) == 0 {
			// A lease lost: which events are done is not known here.
			for k := range done {
				later = append(later, k)
			}
			return nil
		}
		later, err = s.advanceKeys(ctx, tx, done)
		return err
	})
	slices.Sort(later)
	return n, later, s.explain(err)
}

// markDoneTx is markDoneIn through tx, or with ArchiveDelivered
// archiveDone.
func (s *Store) markDoneTx(ctx context.Context, tx *sqlx.Tx, owner string, ids []string, registry int64) (int, error) {
	if s.arch {
		return s.archiveDone(ctx, tx, owner, ids, registry)
	}
	return s.markDoneIn(ctx, func(ctx context.Context, q string, args ...any) (int, error) {
		return execN(ctx, tx, q, args...)
	}, owner, ids, registry)
}

// advanceKeys raises the done_seq of the keys in done that no transaction
// holds, in one UPDATE: PostgreSQL picks them in the statement; MySQL
// locks them first (SKIP LOCKED needs a SELECT); SQLite has one writer,
// and nobody to wait for. It returns the keys with events numbered after
// done's, and those passed over.
func (s *Store) advanceKeys(ctx context.Context, tx *sqlx.Tx, done map[string]int64) ([]string, error) {
	keys := make([]string, 0, len(done))
	for k := range done {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var cases strings.Builder
	var cargs []any
	cases.WriteString(`CASE ordering_key`)
	then := ` WHEN ? THEN ?`
	if s.d.name == "postgres" {
		then = ` WHEN ? THEN CAST(? AS BIGINT)`
	}
	for _, k := range keys {
		cases.WriteString(then)
		cargs = append(cargs, k, done[k])
	}
	cases.WriteString(` END`)
	greatest := `GREATEST`
	if s.d.name == "sqlite" {
		greatest = `MAX`
	}
	set := `UPDATE ` + s.KeysTable() + ` SET done_seq = ` + greatest + `(done_seq, ` + cases.String() + `) WHERE ordering_key IN `
	// seqs: the keys' numbers as read under their locks; a key missing
	// was passed over.
	seqs := map[string]int64{}
	scan := func(rs *sql.Rows, err error) error {
		if err != nil {
			return err
		}
		for rs.Next() {
			var k string
			var seq int64
			if err := rs.Scan(&k, &seq); err != nil {
				rs.Close()
				return err
			}
			seqs[k] = seq
		}
		return errors.Join(rs.Err(), rs.Close())
	}
	var err error
	switch s.d.name {
	case "postgres":
		err = scan(tx.QueryContext(ctx, s.rebind(set+`(SELECT ordering_key FROM `+s.KeysTable()+` WHERE ordering_key IN `+in(len(keys))+s.d.lock+`) RETURNING ordering_key, seq`), append(cargs, stringArgs(keys)...)...))
	case "mysql":
		if err = scan(tx.QueryContext(ctx, s.rebind(`SELECT ordering_key, seq FROM `+s.KeysTable()+` WHERE ordering_key IN `+in(len(keys))+s.d.lock), stringArgs(keys)...)); err != nil || len(seqs) == 0 {
			break
		}
		free := make([]string, 0, len(seqs))
		for _, k := range keys {
			if _, ok := seqs[k]; ok {
				free = append(free, k)
			}
		}
		_, err = tx.ExecContext(ctx, s.rebind(set+in(len(free))), append(cargs, stringArgs(free)...)...)
	default:
		if _, err = tx.ExecContext(ctx, s.rebind(set+in(len(keys))), append(cargs, stringArgs(keys)...)...); err != nil {
			break
		}
		err = scan(tx.QueryContext(ctx, s.rebind(`SELECT ordering_key, seq FROM `+s.KeysTable()+` WHERE ordering_key IN `+in(len(keys))), stringArgs(keys)...))
	}
	if err != nil {
		return nil, err
	}
	var later []string
	for _, k := range keys {
		if seq, ok := seqs[k]; !ok || seq > done[k] {
			later = append(later, k)
		}
	}
	return later, nil
}

// capDone lowers each key's number in done below the key's earliest event
// still pending under f: an event delivered while an earlier one of its
// key is owed to some subscription (who was behind when it was claimed)
// must not take the key's record past that one, or the next event
// published would be taken for the head and go out on the hot path.
func (s *Store) capDone(ctx context.Context, f driver.OrderFilter, done map[string]int64) error {
	if len(done) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(done))
	cond, args := s.pending("p", f, keys...)
	err := s.retry(ctx, func() error {
		rs, err := s.db.QueryContext(ctx, s.rebind(`SELECT p.ordering_key, MIN(p.key_seq) FROM `+s.table+` p`+s.byKey()+` WHERE `+cond+` GROUP BY p.ordering_key`), args...)
		if err != nil {
			return err
		}
		for rs.Next() {
			var k string
			var first int64
			if err := rs.Scan(&k, &first); err != nil {
				rs.Close()
				return err
			}
			if n, ok := done[k]; ok && n >= first {
				if first <= 1 {
					delete(done, k)
				} else {
					done[k] = first - 1
				}
			}
		}
		return errors.Join(rs.Err(), rs.Close())
	})
	if err != nil {
		return s.explain(fmt.Errorf("sqlstore: keys done: %w", err))
	}
	return nil
}

// doneOf adds to done, key by key, the highest number among the events ids
// that are no longer pending under f, or no longer stored (deleted at
// delivery: then with the number evs give).
func (s *Store) doneOf(ctx context.Context, ids []string, evs []driver.KeyDone, f driver.OrderFilter, done map[string]int64) error {
	state, sargs := s.pendingState("o", f)
	type found struct {
		key     string
		seq     int64
		pending bool
	}
	rows := map[string]found{}
	err := s.retry(ctx, func() error {
		clear(rows)
		rs, err := s.db.QueryContext(ctx, s.rebind(`SELECT o.id, o.ordering_key, o.key_seq, CASE WHEN `+state+` THEN 1 ELSE 0 END FROM `+s.table+` o
WHERE o.id IN `+in(len(ids))+` AND o.key_seq IS NOT NULL`), append(sargs, stringArgs(ids)...)...)
		if err != nil {
			return err
		}
		for rs.Next() {
			var id string
			var fd found
			var pending int
			if err := rs.Scan(&id, &fd.key, &fd.seq, &pending); err != nil {
				rs.Close()
				return err
			}
			fd.pending = pending == 1
			rows[id] = fd
		}
		return errors.Join(rs.Err(), rs.Close())
	})
	if err != nil {
		return s.explain(fmt.Errorf("sqlstore: keys done: %w", err))
	}
	for _, ev := range evs {
		if !slices.Contains(ids, ev.EventID) {
			continue
		}
		fd, ok := rows[ev.EventID]
		switch {
		case ok && !fd.pending:
			done[fd.key] = max(done[fd.key], fd.seq)
		case !ok && ev.Seq > 0 && ev.Key != "":
			done[ev.Key] = max(done[ev.Key], ev.Seq) // deleted at delivery
		}
	}
	return nil
}

func checkKey(r *driver.Row) error {
	switch {
	case r.OrderingKey == "":
		return fmt.Errorf("sqlstore: event %s has no ordering key: set Envelope.OrderingKey or the aggregate's type and id", r.ID)
	case len(r.OrderingKey) > MaxOrderingKeyLen:
		return fmt.Errorf("sqlstore: event %s: ordering key of %d bytes; at most %d fit", r.ID, len(r.OrderingKey), MaxOrderingKeyLen)
	}
	return nil
}

// InsertOrdered implements driver.OrderedStore. Whether the event is its
// key's head is read from the key's own row, which the statement has just
// locked: the event before it (number seq-1) is delivered if the row's
// done_seq, which the engine advances after deliveries (KeysDone), has
// reached it. The publishing transaction reads no outbox row, so it locks
// none: it never holds up the engine's writes, nor other keys' publishers.
// done_seq may lag (the engine advances it where no publisher holds the
// key); the event is then written free and claimed right after commit,
// unless r.KeyAfter says the owner holds its predecessor.
// One statement on PostgreSQL, two on MySQL, three on SQLite.
func (s *Store) InsertOrdered(ctx context.Context, exec driver.Execer, r *driver.Row, owner string, lease time.Duration, f driver.OrderFilter) (head, leased bool, err error) {
	if err := checkKey(r); err != nil {
		return false, false, err
	}
	keys := s.KeysTable()
	switch s.d.name {
	case "mysql":
		mine := false      // this transaction inserted the key's row
		var release func() // the key's gate, held while this transaction may insert the row
		if !s.known.has(r.OrderingKey) {
			if mine = s.gates.mine(r.OrderingKey, exec); !mine {
				release = s.keyRow(ctx, exec, r.OrderingKey)
			}
		}
		// The key's next number and whether the previous event is
		// delivered, packed into LAST_INSERT_ID, which the OK packet
		// carries back (a new key reports 0: number 1, nothing before).
		res, err := exec.ExecContext(ctx, s.rebind(`INSERT INTO `+keys+` (ordering_key, seq, done_seq) VALUES (?, 1, 0)
ON DUPLICATE KEY UPDATE seq = LAST_INSERT_ID((seq + 1) * 2 + (done_seq < seq)) DIV 2`), r.OrderingKey)
		var packed int64
		if err == nil {
			packed, err = res.LastInsertId()
		}
		if release != nil {
			if err == nil && packed == 0 {
				// This transaction inserted the row: the gate is held
				// until it ends.
				h := exec.(txHooks)
				key := r.OrderingKey
				h.AfterCommit(func() { s.known.add(key); release() })
				h.AfterRollback(release)
			} else {
				release()
			}
		}
		if err != nil {
			return false, false, s.explain(err)
		}
		r.KeySeq, head = 1, true
		if packed != 0 {
			// The row was there, committed (a row another transaction
			// was inserting would have been waited for), unless this
			// transaction inserted it.
			r.KeySeq, head = packed/2, packed%2 == 0
			if !mine {
				s.known.add(r.OrderingKey)
			}
		}
		leased = leases(owner, head, r)
		return head, leased, s.insertAt(ctx, exec, r, ownerIf(leased, owner), lease)
	case "postgres":
		// The upsert's RETURNING gives the row as updated, after the lock
		// was granted; the INSERT reads it from there, not from the
		// statement's snapshot.
		return s.insertPostgres(ctx, exec, r, owner, lease)
	default:
		if _, err := exec.ExecContext(ctx, s.rebind(`INSERT INTO `+keys+` (ordering_key, seq, done_seq) VALUES (?, 1, 0)
ON CONFLICT (ordering_key) DO UPDATE SET seq = seq + 1`), r.OrderingKey); err != nil {
			return false, false, s.explain(err)
		}
		if qr, ok := exec.(rowQuerier); ok {
			// The number and the head bit in one read; the INSERT then
			// binds the number.
			var h int
			if err := qr.QueryRowContext(ctx, s.rebind(`SELECT seq, CASE WHEN done_seq >= seq - 1 THEN 1 ELSE 0 END FROM `+keys+` WHERE ordering_key = ?`), r.OrderingKey).Scan(&r.KeySeq, &h); err != nil {
				return false, false, s.explain(err)
			}
			head = h == 1
			leased = leases(owner, head, r)
			return head, leased, s.insertAt(ctx, exec, r, ownerIf(leased, owner), lease)
		}
		res, err := exec.ExecContext(ctx, s.rebind(`UPDATE `+keys+` SET seq = seq WHERE ordering_key = ? AND done_seq >= seq - 1`), r.OrderingKey)
		if err != nil {
			return false, false, s.explain(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, false, err
		}
		head = n == 1
		leased = owner != "" && head
		ownerSQL, untilSQL, lock := s.lockSQL(ownerIf(leased, owner), lease)
		seq := `(SELECT seq FROM ` + keys + ` WHERE ordering_key = ?)`
		_, err = exec.ExecContext(ctx, s.rebind(s.insertOrderedSQL(seq, ownerSQL, untilSQL)), s.insertOrderedArgs(r, append([]any{r.OrderingKey}, lock...)...)...)
		return head, leased, s.explain(err)
	}
}

// leases reports whether r, numbered, is written leased to owner: it is
// its key's head, or the owner holds the event before it (r.KeyAfter).
func leases(owner string, head bool, r *driver.Row) bool {
	return owner != "" && (head || (r.KeyAfter > 0 && r.KeySeq == r.KeyAfter+1))
}

// ownerIf returns owner if leased, else "" (a free row).
func ownerIf(leased bool, owner string) string {
	if leased {
		return owner
	}
	return ""
}

// insertAt writes r with its number r.KeySeq, leased to owner ("": free).
func (s *Store) insertAt(ctx context.Context, exec driver.Execer, r *driver.Row, owner string, lease time.Duration) error {
	ownerSQL, untilSQL, lock := s.lockSQL(owner, lease)
	_, err := exec.ExecContext(ctx, s.rebind(s.insertOrderedSQL("?", ownerSQL, untilSQL)), s.insertOrderedArgs(r, append([]any{r.KeySeq}, lock...)...)...)
	return s.explain(err)
}

// insertPostgres writes r numbered by the key's row, which one statement
// locks and updates (upserts), and inserts r with. The upsert's RETURNING
// gives the row as updated, after the lock was granted; the INSERT reads
// it from there, not from the statement's snapshot.
func (s *Store) insertPostgres(ctx context.Context, exec driver.Execer, r *driver.Row, owner string, lease time.Duration) (head, leased bool, err error) {
	qr, queries := exec.(rowQuerier)
	after := int64(0)
	if queries {
		after = r.KeyAfter // else leased must equal head: nothing else is reported
	}
	ownerSQL, untilSQL, lock := s.lockSQL(owner, lease)
	if owner != "" {
		ownerSQL, untilSQL = `(SELECT CASE WHEN lease THEN `+ownerSQL+` END FROM k)`, `(SELECT CASE WHEN lease THEN `+untilSQL+` END FROM k)`
	}
	q := `WITH k0 AS (INSERT INTO ` + s.KeysTable() + ` AS k (ordering_key, seq, done_seq) VALUES (?, 1, 0)
ON CONFLICT (ordering_key) DO UPDATE SET seq = k.seq + 1 RETURNING seq, done_seq),
k AS (SELECT seq, done_seq >= seq - 1 AS head, (done_seq >= seq - 1 OR (CAST(? AS BIGINT) > 0 AND seq = CAST(? AS BIGINT) + 1)) AS lease FROM k0),
ins AS (` + s.insertOrderedSQL(`(SELECT seq FROM k)`, ownerSQL, untilSQL) + ` RETURNING locked_by)
`
	args := append([]any{r.OrderingKey, after, after}, s.insertOrderedArgs(r, lock...)...)
	if queries {
		// The transaction can answer a query: learn the number too.
		err := qr.QueryRowContext(ctx, s.rebind(q+`SELECT k.seq, k.head, ins.locked_by IS NOT NULL FROM k, ins`), args...).Scan(&r.KeySeq, &head, &leased)
		return head, leased, s.explain(err)
	}
	// One row for an event written, two for one written leased.
	res, err := exec.ExecContext(ctx, s.rebind(q+`SELECT 1 FROM ins UNION ALL SELECT 1 FROM ins WHERE locked_by IS NOT NULL`), args...)
	if err != nil {
		return false, false, s.explain(err)
	}
	n, err := res.RowsAffected()
	return n == 2, n == 2, err
}

// createKeyWait bounds createKey's statement: past it, the publishing
// transaction creates the key's row itself.
const createKeyWait = 250 * time.Millisecond

// createKey makes sure, on MySQL, that key's row exists, committed, before
// the publishing transaction takes its number: it inserts the row (number
// 0) outside that transaction, unless the key is known to exist. A row the
// application's transaction inserted would go again at its rollback, and
// InnoDB then leaves every transaction that waited for it with a lock on
// the gap where it was: two of them block each other's insert of the row,
// and one fails with a deadlock (1213;
// TestRolledBackFirstPublisherOfAKeyFailsNoOther). A deadlock of this
// statement (the same case, should a row inserted the old way go) is only
// this statement's: it is retried.
//
// The rows are made by the key maker (keyMaker), on a connection it holds
// while new keys come, so that they are made also when every other
// connection of the pool is held by application transactions
// (TestNewKeyOfAFullPoolRolledBackFailsNoOther). A pool of fewer than 4
// connections lends it none: there the row is made on a connection of the
// pool if one is free, never waited for (every one may be held by a
// publishing transaction: waiting could wait forever). When the row is
// not made within createKeyWait, the transaction inserts it itself; the
// risk above then stays only for publishers of other processes: those of
// this one wait for the transaction's end in the key's gate (keyGates).
// createKey reports whether the row is known to be committed.
func (s *Store) createKey(ctx context.Context, key string) bool {
	if s.known.has(key) {
		return true
	}
	st := s.db.Stats()
	ctx, cancel := context.WithTimeout(ctx, createKeyWait)
	defer cancel()
	if s.maker.usable(st) {
		return s.maker.make(ctx, s, key) == nil
	}
	if poolFull(st) {
		return false
	}
	err := s.retry(ctx, func() error {
		_, err := s.db.ExecContext(ctx, s.rebind(`INSERT IGNORE INTO `+s.KeysTable()+` (ordering_key, seq, done_seq) VALUES (?, 0, 0)`), key)
		return err
	})
	if err == nil {
		s.known.add(key)
	}
	return err == nil
}

// keyRow readies key's row on MySQL before a publisher of exec numbers
// from it: made outside the transaction (createKey), unless another
// transaction of the process is inserting it, whose end is waited for
// first (keyGates). If the row may still be missing, it returns the held
// gate of the key (nil when exec tells no end of its transaction, or the
// wait ran out), which the caller keeps until its transaction ends if it
// inserts the row, and else releases.
func (s *Store) keyRow(ctx context.Context, exec driver.Execer, key string) (release func()) {
	if s.known.has(key) {
		return nil
	}
	if _, ok := exec.(txHooks); !ok {
		s.createKey(ctx, key)
		return nil
	}
	if s.gates.busy(key) {
		// Not asked of the key maker: its statement would wait for that
		// transaction's row, and hold up the other keys of its batch.
		release = s.gates.enter(ctx, key, exec)
		if s.known.has(key) { // the transaction committed the row
			if release != nil {
				release()
			}
			return nil
		}
	}
	if s.createKey(ctx, key) {
		if release != nil {
			release()
		}
		return nil
	}
	if release == nil {
		release = s.gates.enter(ctx, key, exec)
	}
	return release
}

// knownKeys is the set of ordering keys whose row is known to be committed
// (rows are never deleted), in two generations of at most knownKeysMax
// each: when the newer is full, the older is dropped. A key forgotten
// costs one INSERT IGNORE (createKey).
type knownKeys struct {
	mu       sync.Mutex
	new, old map[string]struct{}
}

const knownKeysMax = 1 << 16

func (k *knownKeys) has(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.new[key]; ok {
		return true
	}
	_, ok := k.old[key]
	return ok
}

func (k *knownKeys) add(key string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.new == nil {
		k.new = map[string]struct{}{}
	}
	if _, ok := k.new[key]; ok {
		return
	}
	if len(k.new) >= knownKeysMax {
		k.old, k.new = k.new, map[string]struct{}{}
	}
	k.new[key] = struct{}{}
}

// rowQuerier is a transaction that can answer a query (*sql.Tx, sqlx.Tx,
// txmw's): InsertOrdered learns the event's number from it on PostgreSQL.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// lockSQL returns the SQL of an ordered row's owner and lease end, and
// their parameters: NULL, NULL for a free row.
func (s *Store) lockSQL(owner string, lease time.Duration) (ownerSQL, untilSQL string, args []any) {
	if owner == "" {
		return "NULL", "NULL", nil
	}
	return "?", s.d.nowPlus, []any{owner, lease.Microseconds()}
}

// orderedColumns are the columns an ordered row is written with, in the
// order insertOrderedArgs binds them (insertOrderedSQL, insertAfter).
const orderedColumns = `(id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, available_at, created_at, ordering_key, key_seq, locked_by, locked_until)`

// insertOrderedSQL is the INSERT of an ordered row, with the SQL of its
// number, its owner and its lease's end; unbound.
func (s *Store) insertOrderedSQL(seq, owner, until string) string {
	return `INSERT INTO ` + s.table + ` ` + orderedColumns + `
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, ` + s.d.now + `, ` + s.d.now + `, ?, ` + seq + `, ` + owner + `, ` + until + `)`
}

// insertOrderedArgs binds insertOrderedSQL: the row's values and key, then
// more (those of the number's, the owner's and the lease's SQL).
func (s *Store) insertOrderedArgs(r *driver.Row, more ...any) []any {
	args := s.insertArgs(nil, r, "", 0)
	out := append(args[:len(args)-3], r.OrderingKey) // insertArgs ends with owner, lease, key
	return append(out, more...)
}

// ClaimHeads implements driver.OrderedStore. It reads the keys' heads
// without locking, then leases those that are due and free in a short
// transaction (FOR UPDATE SKIP LOCKED where the database has it), and
// there reads which ordered subscriptions owe earlier events of their
// keys (Row.Behind): a head changes only to a later event (or, by a
// replay, to an earlier one, which then waits until no other event of its
// key is leased), so a head read a moment ago is either still the head or
// no longer pending, and then not leased. The same read gives the runs
// behind the heads (req.Run): the events that follow each head without a
// gap, whole, due and free, leased with it in the same statement; an event
// the lease's locking read does not take ends its run (runsOf).
func (s *Store) ClaimHeads(ctx context.Context, req driver.ClaimRequest, keys []string, f driver.OrderFilter) ([]driver.Row, error) {
	if len(keys) == 0 || req.Limit <= 0 {
		return nil, nil
	}
	heads, runs, err := s.readHeads(ctx, keys, req.Limit, req.Run/min(len(keys), req.Limit))
	if err != nil {
		return nil, s.explain(fmt.Errorf("sqlstore: claim heads: %w", err))
	}
	if len(heads) == 0 {
		return nil, nil
	}
	c := headClaim{req: req, f: f, runs: len(runs) > 0, isHead: make(map[string]bool, len(heads))}
	for _, id := range heads {
		c.isHead[id] = true
	}
	c.q, c.args = s.claimHeadsSQL(heads, runs)
	var out []driver.Row
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		var err error
		out, err = s.leaseHeads(ctx, tx, c)
		return err
	})
	if err != nil {
		return nil, s.explain(fmt.Errorf("sqlstore: claim heads: %w", err))
	}
	return out, nil
}

// readHeads reads each key's head: the first of its events NEW or RETRY
// as a whole, by id, so that the lease looks rows up by primary key; and
// behind each head the events of its run (up to perKey a key). Events of
// the key pending under the filter that are not (dead, or split with
// deliveries owed: typically none) say that some subscription may be
// behind. A key none of whose events the lease could take is passed over
// here: one with an event NEW or RETRY under a live lease (its head in
// another instance's hands, typically, and the key named by the
// publisher of the event behind it), or whose head is not due. A claim of
// such keys only would open a transaction for nothing.
//
// Only the keys' whole events NEW or RETRY are read: the split and dead
// ones before a head (typically a subscription's backlog, the bulk of a
// key's rows while it is behind) would be read in full by every claim.
// Whether a subscription is behind for a head is looked up per head
// instead (behind, which stops at the first event owed). It keeps the
// heads of the first most keys, in key order, that have one.
func (s *Store) readHeads(ctx context.Context, keys []string, most, perKey int) (heads, runs []string, err error) {
	err = s.retry(ctx, func() error {
		q, args := s.headReadSQL(keys, perKey)
		rs, err := s.db.QueryContext(ctx, s.bounded(ctx, q), args...)
		if err != nil {
			return err
		}
		r := headReader{most: most, perKey: perKey}
		for rs.Next() {
			var k, id string
			var st, busy int
			var ks int64
			if err := rs.Scan(&k, &id, &st, &ks, &busy); err != nil {
				rs.Close()
				return err
			}
			if !r.add(k, id, ks, busy) {
				break // most heads: the rest is not needed
			}
		}
		r.flush()
		heads, runs = r.heads, r.runs
		return errors.Join(rs.Err(), rs.Close())
	})
	return heads, runs, err
}

// headReader takes headReadSQL's rows, in key and number order, and keeps
// each key's head and run unless the key is held (an event of it in
// flight, or its head not due).
type headReader struct {
	most, perKey int // heads, events of a run
	heads, runs  []string

	key, head string
	held      bool
	run       []string // the events after head that may go with it
	seq       int64    // the number of run's last event (or head's)
	open      bool     // the key's rows still continue the run
}

// add takes one row: busy is 1 for an event under a live lease, 2 for a
// head not due, 0 otherwise. It reports false, taking nothing, once the
// row is of a key after most heads.
func (r *headReader) add(key, id string, seq int64, busy int) bool {
	if key != r.key {
		r.flush()
		if len(r.heads) >= r.most {
			r.head = ""
			return false
		}
		r.key, r.head, r.held, r.run, r.open = key, "", false, nil, false
	}
	switch {
	case r.head == "":
		r.head, r.seq, r.open = id, seq, r.perKey > 0
		r.held = r.held || busy == 2
	case r.open && busy == 0 && seq == r.seq+1 && len(r.run) < r.perKey:
		r.run = append(r.run, id)
		r.seq = seq
	default:
		r.open = false
	}
	r.held = r.held || busy == 1
	return true
}

func (r *headReader) flush() {
	if r.head != "" && !r.held && len(r.heads) < r.most {
		r.heads = append(r.heads, r.head)
		r.runs = append(r.runs, r.run...)
	}
}

// headClaim is what the lease of a claim of heads needs.
type headClaim struct {
	req    driver.ClaimRequest
	f      driver.OrderFilter
	q      string // claimHeadsSQL's read, bound by args
	args   []any
	isHead map[string]bool
	runs   bool // runs were read behind the heads
}

// claimHeadsSQL is the read of heads and runs that are still due and
// free, and its arguments; locking where the database leases by that
// lock.
//
// Not while another event of the key is leased as a whole: a head that
// was replayed after its key went on (OrderedSkipDead) waits for the
// later event in flight. One lookup per status (see owesSQL), and for
// heads only: an event of a run is kept only behind its head (runsOf),
// and a lookup per event of a run would read the key's backlog once per
// event (quadratic in a deep key's backlog).
//
// On PostgreSQL the rows are read without a lock and leased by an UPDATE
// that checks again that each is free (leaseFree): locking them as they
// are read (FOR UPDATE) writes every row twice, its lock and its lease,
// and took most of a claim's time while a backlog of many keys drained
// (BENCHMARKS.md, item 21).
func (s *Store) claimHeadsSQL(heads, runs []string) (string, []any) {
	byPK := ""
	if s.d.name == "mysql" {
		byPK = ` FORCE INDEX (PRIMARY)`
	}
	noneLeased := `NOT EXISTS (SELECT 1 FROM ` + s.table + ` q` + s.byKey() + ` WHERE q.status = 0 AND q.ordering_key = o.ordering_key AND q.key_seq IS NOT NULL
    AND q.id <> o.id AND q.locked_until > ` + s.d.now + `)
  AND NOT EXISTS (SELECT 1 FROM ` + s.table + ` q` + s.byKey() + ` WHERE q.status = 2 AND q.ordering_key = o.ordering_key AND q.key_seq IS NOT NULL
    AND q.id <> o.id AND q.locked_until > ` + s.d.now + `)`
	args := stringArgs(slices.Concat(heads, runs))
	if len(runs) > 0 {
		noneLeased = `(o.id IN ` + in(len(runs)) + ` OR (` + noneLeased + `))`
		args = stringArgs(runs, args...)
	}
	lock := s.d.lock
	if s.d.name == "postgres" {
		lock = ""
	}
	q := s.rebind(`SELECT ` + rowColumns + ` FROM ` + s.table + ` o` + byPK + ` WHERE o.id IN ` + in(len(heads)+len(runs)) + `
  AND o.status IN (0, 2) AND o.available_at <= ` + s.d.now + `
  AND (o.locked_until IS NULL OR o.locked_until <= ` + s.d.now + `)
  AND ` + noneLeased + ` LIMIT ?` + lock)
	return q, append(args, len(heads)+len(runs))
}

// withBehind gives each of rows, heads and the runs behind them in key
// and number order, its head's Behind (subs): the subscriptions behind
// owe the events of a run the head too. Every head is kept, even one
// that only subscriptions behind take (left whole, it would hold its key
// back for the others too), but for one that every subscription is
// behind on (OrderFilter.AllBehind), with its run: there are no others.
// It returns the rows kept and their ids.
func withBehind(rows []driver.Row, isHead map[string]bool, subs map[string][]string, f driver.OrderFilter) (kept []driver.Row, ids []string) {
	var headBehind []string
	kept, all := rows[:0], false
	for _, r := range rows {
		if isHead[r.ID] {
			headBehind = subs[r.ID]
			all = f.AllBehind(headBehind)
		}
		if !all {
			r.Behind = headBehind
			kept = append(kept, r)
			ids = append(ids, r.ID)
		}
	}
	return kept, ids
}

// leaseHeads reads c's heads and runs in tx, notes which subscriptions
// are behind on each (Row.Behind), and leases them to c.req.Owner.
func (s *Store) leaseHeads(ctx context.Context, tx *sqlx.Tx, c headClaim) ([]driver.Row, error) {
	out, _, err := selectRows(ctx, tx, nil, false, c.q, c.args...)
	if err != nil || len(out) == 0 {
		return nil, err
	}
	if c.runs {
		if out = runsOf(out, c.isHead); len(out) == 0 {
			return nil, nil
		}
	}
	var owing []string
	for i := range out {
		if c.isHead[out[i].ID] {
			owing = append(owing, out[i].ID)
		}
	}
	subs, err := s.behind(ctx, tx, owing, c.f)
	if err != nil {
		return nil, err
	}
	out, ids := withBehind(out, c.isHead, subs, c.f)
	if len(out) == 0 {
		return nil, nil
	}
	if s.d.name != "postgres" {
		_, err = tx.ExecContext(ctx, s.leaseSQL(len(ids)), s.idArgs(ids, c.req.Owner, c.req.Lease.Microseconds())...)
		return out, err
	}
	got, err := s.leaseFree(ctx, tx, ids, c.req)
	if err != nil {
		return nil, err
	}
	leased := out[:0]
	for _, r := range out {
		if g, ok := got[r.ID]; ok {
			// As read, but for the lease's owner: the lease taken over,
			// if any (Row.PrevOwner).
			g.Behind, g.PrevOwner = r.Behind, r.PrevOwner
			leased = append(leased, g)
		}
	}
	if !c.runs || len(leased) == 0 {
		return leased, nil
	}
	// An event whose predecessor another claim took in between is given
	// back: it goes after that one, from its claimer.
	out = runsOf(leased, c.isHead)
	if len(out) == len(got) {
		return out, nil
	}
	keep := make(map[string]bool, len(out))
	for _, r := range out {
		keep[r.ID] = true
	}
	var back []string
	for id := range got {
		if !keep[id] {
			back = append(back, id)
		}
	}
	_, err = tx.ExecContext(ctx, s.releaseSQL(len(back), false), s.idArgs(back, c.req.Owner)...)
	return out, err
}

// headWindowKeys is the most keys whose heads ClaimHeads reads through a
// window each (headReadSQL); more are read in one range.
const headWindowKeys = 32

// headReadSQL is ClaimHeads' read of keys' NEW and RETRY events, in key
// and number order. For up to headWindowKeys keys it reads of each key
// and status the first perKey+1 events only (the head and a run behind
// it), as one subquery each: a key with a deep backlog then costs a claim
// the run it can take, not a read of the whole backlog (which made
// draining one key of n events cost ~n²/1,000 row reads). An event in
// flight further down the key is not seen here; the lease statement's
// check of the heads (no other event of the key leased) still keeps the
// key's head from going out beside it.
func (s *Store) headReadSQL(keys []string, perKey int) (string, []any) {
	cols := `p.ordering_key AS ordering_key, p.id AS id, p.status AS status, p.key_seq AS key_seq,
  CASE WHEN p.locked_until > ` + s.d.now + ` THEN 1 WHEN p.available_at > ` + s.d.now + ` THEN 2 ELSE 0 END AS busy
FROM ` + s.table + ` p` + s.byKey()
	if len(keys) > headWindowKeys {
		return s.rebind(`SELECT ` + cols + ` WHERE p.status IN (0, 2) AND p.ordering_key` + keyIs(len(keys)) + ` AND p.key_seq IS NOT NULL
ORDER BY ordering_key, key_seq`), stringArgs(keys)
	}
	limit := strconv.Itoa(perKey + 1)
	parts := make([]string, 0, 2*len(keys))
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		for _, st := range []string{"0", "2"} {
			parts = append(parts, `SELECT * FROM (SELECT `+cols+` WHERE p.status = `+st+` AND p.ordering_key = ? AND p.key_seq IS NOT NULL
ORDER BY p.key_seq LIMIT `+limit+`) h`+strconv.Itoa(len(parts)))
			args = append(args, k)
		}
	}
	return s.rebind(strings.Join(parts, "\nUNION ALL\n") + "\nORDER BY ordering_key, key_seq"), args
}

// leaseFreeWait bounds leaseFree's wait for a row another transaction
// holds.
const leaseFreeWait = 100 * time.Millisecond

// leaseFree leases to req.Owner those of the events ids that are still
// NEW or RETRY, due and under no live lease, checked on each row as the
// UPDATE reaches it (after any other transaction that holds the row
// ends), and returns them as leased, by id.
func (s *Store) leaseFree(ctx context.Context, tx *sqlx.Tx, ids []string, req driver.ClaimRequest) (map[string]driver.Row, error) {
	// A row another transaction holds is waited for, not passed over as
	// FOR UPDATE SKIP LOCKED would: briefly, so that this transaction,
	// which holds the rows it leased so far, keeps nobody waiting long
	// (their owners' lease renewals, say). Past it the claim fails with
	// 55P03 and is tried again (inTx).
	if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = '`+strconv.Itoa(int(leaseFreeWait.Milliseconds()))+`ms'`); err != nil {
		return nil, err
	}
	rs, err := tx.QueryContext(ctx, s.leaseFreeSQL(len(ids)), s.idArgs(ids, req.Owner, req.Lease.Microseconds())...)
	if err != nil {
		return nil, err
	}
	got := make(map[string]driver.Row, len(ids))
	for rs.Next() {
		r, err := scanRow(rs)
		if err != nil {
			rs.Close()
			return nil, err
		}
		got[r.ID] = r
	}
	return got, errors.Join(rs.Err(), rs.Close())
}

// leaseFreeSQL is leaseFree's UPDATE of n rows (PostgreSQL).
func (s *Store) leaseFreeSQL(n int) string {
	return s.rebind(s.q.update + ` SET locked_by = ?, locked_until = ` + s.d.nowPlus + ` WHERE id` + s.idIn(n) + `
  AND ` + s.d.statusByID() + ` IN (0, 2) AND available_at <= ` + s.d.now + ` AND (locked_until IS NULL OR locked_until <= ` + s.d.now + `)
RETURNING ` + rowColumns)
}

// runsOf orders rows, heads and the runs read behind them (ClaimHeads),
// by key and number, and keeps of each key its head and the events that
// follow it without a gap: an event whose predecessor the lease's read
// did not take (locked, no longer due) stays in the table.
func runsOf(rows []driver.Row, isHead map[string]bool) []driver.Row {
	slices.SortFunc(rows, func(a, b driver.Row) int {
		return cmp.Or(strings.Compare(a.OrderingKey, b.OrderingKey), cmp.Compare(a.KeySeq, b.KeySeq))
	})
	out := rows[:0]
	key, seq := "", int64(0) // the last row kept: its key and number
	for _, r := range rows {
		switch {
		case isHead[r.ID]:
			key, seq = r.OrderingKey, r.KeySeq
		case r.OrderingKey == key && r.KeySeq == seq+1:
			seq = r.KeySeq
		default:
			continue
		}
		out = append(out, r)
	}
	return out
}

// behind returns, for each of the events ids, the ordered subscriptions
// of f that an earlier event of its key is pending for, or that have a
// delivery of another event of the key under a live lease (a replayed
// one, or a later one while this one was replayed): Row.Behind, in name
// order.
func (s *Store) behind(ctx context.Context, tx *sqlx.Tx, ids []string, f driver.OrderFilter) (map[string][]string, error) {
	out := map[string][]string{}
	if len(ids) == 0 || f.Empty() {
		return out, nil
	}
	sets := map[string]map[string]bool{}
	add := func(id, sub string) {
		if sets[id] == nil {
			sets[id] = map[string]bool{}
		}
		sets[id][sub] = true
	}
	scan := func(q string, args []any, subs ...string) error {
		rs, err := tx.QueryContext(ctx, s.rebind(q), args...)
		if err != nil {
			return err
		}
		for rs.Next() {
			var id string
			if err := rs.Scan(&id); err != nil {
				rs.Close()
				return err
			}
			for _, sub := range subs {
				add(id, sub)
			}
		}
		return errors.Join(rs.Err(), rs.Close())
	}
	// Per ordered subscription, split earlier events with a delivery owed
	// to it (or dead, to a blocking one), or a delivery of another event
	// of the key to it under a live lease. EXISTS stops at the first such
	// event, typically the key's first (what a subscription owes is its
	// key's backlog); a join of each head with its key's events read the
	// whole backlog once per head (a claim behind 74 keys' backlogs took
	// 5 s on PostgreSQL).
	for _, sub := range slices.Concat(f.Block, f.Skip) {
		cond := `e.status IN (0, 2) AND (p.key_seq < o.key_seq OR e.locked_until > ` + s.d.now + `)`
		if f.Blocks(sub) {
			cond = `(` + cond + ` OR (p.key_seq < o.key_seq AND e.status = 3))`
		}
		q := `SELECT o.id FROM ` + s.table + ` o WHERE o.id IN ` + in(len(ids)) + ` AND EXISTS (SELECT 1 FROM ` + s.table + ` p` + s.byKey() + `
  JOIN ` + s.DeliveriesTable() + ` e ON e.event_id = p.id AND e.subscription = ?
  WHERE p.status = 4 AND p.ordering_key = o.ordering_key AND p.key_seq IS NOT NULL AND p.id <> o.id AND ` + cond + `)`
		if err := scan(q, append(stringArgs(ids), sub), sub); err != nil {
			return nil, err
		}
	}
	if len(f.Block) > 0 {
		// An earlier event dead as a whole holds every blocking one.
		q := `SELECT o.id FROM ` + s.table + ` o WHERE o.id IN ` + in(len(ids)) + ` AND EXISTS (SELECT 1 FROM ` + s.table + ` p` + s.byKey() + `
  WHERE p.status = 3 AND p.ordering_key = o.ordering_key AND p.key_seq IS NOT NULL AND p.key_seq < o.key_seq)`
		if err := scan(q, stringArgs(ids), f.Block...); err != nil {
			return nil, err
		}
	}
	for id, set := range sets {
		out[id] = slices.Sorted(maps.Keys(set))
	}
	return out, nil
}

// DueKeys implements driver.OrderedStore.
func (s *Store) DueKeys(ctx context.Context, after string, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, nil
	}
	q := s.rebind(`SELECT DISTINCT ordering_key FROM ` + s.table + s.byKey() + `
WHERE status IN (0, 2) AND ordering_key > ? AND key_seq IS NOT NULL AND available_at <= ` + s.d.now + `
  AND (locked_until IS NULL OR locked_until <= ` + s.d.now + `)
ORDER BY ordering_key LIMIT ?`)
	var keys []string
	err := s.retry(ctx, func() error {
		keys = keys[:0]
		return s.db.SelectContext(ctx, &keys, q, after, limit)
	})
	return keys, s.explain(err)
}

// BlockedKeys implements driver.OrderedStore.
func (s *Store) BlockedKeys(ctx context.Context, f driver.OrderFilter, after string, limit int) ([]driver.BlockedKey, error) {
	if limit <= 0 || len(f.Block) == 0 {
		return nil, nil
	}
	// The events dead for a blocking subscription (or dead as a whole:
	// subscription ""), key by key, in order; the first of a key with
	// nothing earlier pending for its subscription is its block.
	q := `SELECT h.ordering_key, h.key_seq, h.id, h.event_type, h.created_at, COALESCE(d.subscription, '') FROM ` + s.table + ` h
  LEFT JOIN ` + s.DeliveriesTable() + ` d ON d.event_id = h.id AND h.status = 4 AND d.subscription IN ` + in(len(f.Block)) + ` AND d.status = 3
WHERE h.status IN (3, 4) AND h.ordering_key > ? AND h.key_seq IS NOT NULL AND (h.status = 3 OR d.event_id IS NOT NULL)
ORDER BY h.ordering_key, h.key_seq, 6 LIMIT ?`
	var out []driver.BlockedKey
	err := s.retry(ctx, func() error {
		out = out[:0]
		// Page by page, until limit keys or the end.
		for from := after; len(out) < limit; {
			page := 4 * limit
			rs, err := s.db.QueryContext(ctx, s.rebind(q), append(stringArgs(f.Block), from, page)...)
			if err != nil {
				return err
			}
			type cand struct {
				driver.BlockedKey
				seq int64
			}
			var cs []cand
			for rs.Next() {
				var c cand
				var created dbTime
				if err := rs.Scan(&c.Key, &c.seq, &c.EventID, &c.Type, &created, &c.Subscription); err != nil {
					rs.Close()
					return err
				}
				c.Since = created.Time
				cs = append(cs, c)
			}
			if err := errors.Join(rs.Err(), rs.Close()); err != nil {
				return err
			}
			n := len(cs)
			if n == page {
				// The last key may go on in the next page: leave it whole
				// to that page (unless it fills this one).
				last := cs[len(cs)-1].Key
				if cs[0].Key != last {
					for len(cs) > 0 && cs[len(cs)-1].Key == last {
						cs = cs[:len(cs)-1]
					}
				}
			}
			blocked, checked := "", map[string]bool{}
			for _, c := range cs {
				if len(out) == limit {
					break
				}
				if c.Key == blocked || checked[c.Key+"\x00"+c.Subscription] {
					continue // the key is listed, or its subscription's first dead event did not block it
				}
				checked[c.Key+"\x00"+c.Subscription] = true
				pf := f // dead as a whole: pending for any of them
				if c.Subscription != "" {
					pf = driver.OrderFilter{Block: []string{c.Subscription}}
				}
				cond, a := s.pending("p", pf, c.Key)
				var earlier, later int64
				err := s.db.QueryRowContext(ctx, s.rebind(`SELECT COALESCE(SUM(CASE WHEN p.key_seq < ? THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN p.key_seq > ? THEN 1 ELSE 0 END), 0) FROM `+s.table+` p`+s.byKey()+` WHERE `+cond),
					append([]any{c.seq, c.seq}, a...)...).Scan(&earlier, &later)
				if err != nil {
					return err
				}
				if earlier == 0 {
					c.Waiting = later
					out = append(out, c.BlockedKey)
					blocked = c.Key
				}
			}
			if n < page {
				break
			}
			from = cs[len(cs)-1].Key
		}
		return nil
	})
	return out, s.explain(err)
}

// SkipDead implements driver.OrderedStore.
func (s *Store) SkipDead(ctx context.Context, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	total := 0
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		total = 0
		res, err := tx.ExecContext(ctx, s.rebind(`UPDATE `+s.table+s.setDone()+` WHERE status = 3 AND id IN `+in(len(ids))), stringArgs(ids)...)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		total += int(n)
		res, err = tx.ExecContext(ctx, s.rebind(`UPDATE `+s.DeliveriesTable()+s.setDone()+` WHERE status = 3 AND event_id IN `+in(len(ids))), stringArgs(ids)...)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		total += int(n)
		// A split event whose deliveries are now all done is done (DONE
		// also in archive mode: what was skipped was never delivered).
		// Locked first: see finishSplit.
		if err := s.lockEvents(ctx, tx, ids); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, s.rebind(`UPDATE `+s.table+` SET status = 1, done_at = `+s.d.now+` WHERE status = 4 AND id IN `+in(len(ids))+`
  AND NOT EXISTS (SELECT 1 FROM `+s.DeliveriesTable()+` d WHERE d.event_id = `+s.table+`.id AND d.status <> 1)`), stringArgs(ids)...)
		return err
	})
	return total, s.explain(err)
}
