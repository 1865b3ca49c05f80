package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/jmoiron/sqlx"
)

// RawKeyed is the database limit of the keyed workload: Keyed's producers
// (a key chosen at random among Keys, a per-key mutex held across the
// transaction, the same order row and payload) in plain SQL, writing the
// minimal outbox row with the event's ordering key and its number in the
// key. With KeyRow, the transaction also upserts the key's row in a key
// table like sqlstore's <table>_keys and takes the number from it, with
// the statements sqlstore's InsertOrdered uses (MySQL: the upsert, whose
// LAST_INSERT_ID carries the number back, then the INSERT with the number
// bound; PostgreSQL: one statement, the upsert in a CTE the INSERT reads
// the number from). Without it, the number is the producer's own count of
// the key, taken under the key's mutex, so both write the same outbox row
// and their ratio is the cost of the key row alone.
type RawKeyed struct {
	Keys   int
	KeyRow bool

	// KeyRows and SeqSum are the key table's row count and sum of seq,
	// read at Teardown before the table is dropped (KeyRow only).
	KeyRows, SeqSum int64

	env     *Env
	tables  []string
	keys    string // quoted key table (KeyRow)
	qOrder  string
	qUpsert string // MySQL: the key-row upsert, before qEvent
	cte     bool   // PostgreSQL: qEvent upserts the key row itself
	qEvent  string
	pmu     []sync.Mutex
	pn      []int64 // per key, events committed (under pmu)
}

// Names of the raw rows of the ordered section.
var (
	RawKeyedName  = (&RawKeyed{Keys: OrderedKeys}).Name()
	RawKeyRowName = (&RawKeyed{Keys: OrderedKeys, KeyRow: true}).Name()
)

func (s *RawKeyed) Name() string {
	if s.KeyRow {
		return fmt.Sprintf("raw SQL, %s keys: order + key row + minimal outbox row", num(float64(s.Keys)))
	}
	return fmt.Sprintf("raw SQL, %s keys: order + minimal outbox row", num(float64(s.Keys)))
}

func (s *RawKeyed) Delivers() bool { return false }

func (s *RawKeyed) Setup(ctx context.Context, env *Env) error {
	s.env = env
	s.pmu, s.pn = make([]sync.Mutex, s.Keys), make([]int64, s.Keys)
	d := env.dialect()
	s.qOrder = insertOrderSQL(env.DB, env.Orders)
	t := d.Quote(env.Prefix + "_kmin")
	s.tables = []string{t}
	if err := createKeyedMinimal(ctx, env.DB, t, env.Prefix+"_kmin"); err != nil {
		return err
	}
	// ordering_key, key_seq first: the key, then the number (bound, or
	// read from the CTE), then the minimal row's arguments.
	cols := `INSERT INTO ` + t + ` (ordering_key, key_seq, id, event_type, aggregate_id, payload, created_at) VALUES (?, %s, ?, 'OrderPlaced', ?, ?, ` + d.Now + `)`
	s.qEvent = env.DB.Rebind(fmt.Sprintf(cols, "?"))
	if !s.KeyRow {
		return nil
	}
	s.keys = d.Quote(env.Prefix + "_kmin_keys")
	s.tables = append(s.tables, s.keys)
	if _, err := env.DB.ExecContext(ctx, fmt.Sprintf(keysDDL, s.keys)); err != nil {
		return fmt.Errorf("harness: create key table: %w", err)
	}
	if d.keyUpsert != "" {
		s.qUpsert = env.DB.Rebind(fmt.Sprintf(d.keyUpsert, s.keys))
	} else {
		s.cte = true
		s.qEvent = env.DB.Rebind(fmt.Sprintf(d.keyCTE, s.keys) + fmt.Sprintf(cols, "(SELECT seq FROM k)"))
	}
	return nil
}

// keysDDL creates a key table (%[1]s) with the columns of sqlstore's
// <table>_keys.
const keysDDL = `CREATE TABLE %[1]s (
  ordering_key VARCHAR(255) NOT NULL PRIMARY KEY,
  seq          BIGINT       NOT NULL,
  done_seq     BIGINT       NOT NULL
)`

func (s *RawKeyed) Tx(ctx context.Context, seq int64, payload []byte) error {
	k := rand.IntN(s.Keys)
	key := "key-" + strconv.Itoa(k)
	s.pmu[k].Lock()
	defer s.pmu[k].Unlock()
	tx, err := beginOrder(ctx, s.env.DB, s.qOrder, seq)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var args []any
	switch {
	case s.cte:
		args = []any{key, key}
	case s.qUpsert != "":
		res, err := tx.ExecContext(ctx, s.qUpsert, key)
		if err != nil {
			return err
		}
		packed, err := res.LastInsertId()
		if err != nil {
			return err
		}
		n := int64(1) // a new key reports 0
		if packed != 0 {
			n = packed / 2
		}
		args = []any{key, n}
	default:
		args = []any{key, s.pn[k] + 1}
	}
	if _, err := tx.ExecContext(ctx, s.qEvent, append(args, minimalRow(seq, payload)...)...); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.pn[k]++
	s.env.Rec.Committed(seq)
	return nil
}

func (s *RawKeyed) Teardown(ctx context.Context) error {
	if len(s.tables) == 0 {
		return nil
	}
	if s.keys != "" {
		row := s.env.DB.QueryRowContext(context.WithoutCancel(ctx), "SELECT COUNT(*), COALESCE(SUM(seq), 0) FROM "+s.keys)
		if err := row.Scan(&s.KeyRows, &s.SeqSum); err != nil {
			return fmt.Errorf("harness: read key table: %w", errors.Join(err, dropTables(ctx, s.env.DB, s.tables...)))
		}
	}
	return dropTables(ctx, s.env.DB, s.tables...)
}

// OrderedRawResult is one run of RawKeyed.
type OrderedRawResult struct {
	CellResult
	KeyRow          bool
	KeyRows, SeqSum int64 // the key table's rows and sum of seq (KeyRow)
}

// RunOrderedRaw runs the raw keyed workload once, with or without the key
// row.
func RunOrderedRaw(ctx context.Context, db *sqlx.DB, keyRow bool, opts CellOptions) (OrderedRawResult, error) {
	sys := &RawKeyed{Keys: OrderedKeys, KeyRow: keyRow}
	opts.Concurrency = OrderedProducers
	res, err := RunCell(ctx, db, sys, opts)
	return OrderedRawResult{CellResult: res, KeyRow: keyRow, KeyRows: sys.KeyRows, SeqSum: sys.SeqSum}, err
}
