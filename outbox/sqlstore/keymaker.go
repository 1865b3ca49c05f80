package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
)

// keyMaker creates the rows of new ordering keys on MySQL (see createKey)
// on a connection it holds for that, so that a key's row is committed
// before its first publisher numbers from it even while every other
// connection of the pool is held by application transactions. It has no
// goroutine of its own: a publisher that needs a row and finds nobody
// creating rows runs one statement for its key and every key asked for
// meanwhile, then hands the next batch to one of the publishers waiting,
// which runs it; the others get the statement's result. The connection is
// taken from the pool at a run that finds one free (never waited for) and
// given back once no row was asked for during keyConnIdle.
type keyMaker struct {
	mu      sync.Mutex
	waiting []*keyWait
	running bool      // a publisher is running a batch; only it uses conn
	conn    *sql.Conn // nil until a run takes one from the pool
	used    time.Time // when the last run ended
	timer   *time.Timer
}

// keyWait is one publisher's request for a key's row.
type keyWait struct {
	key  string
	done chan keyDone // buffered: the result, or the turn to run
	run  bool         // chosen to run the next batch (under keyMaker.mu)
}

type keyDone struct {
	run bool
	err error
}

// keyConnIdle is how long the key maker keeps its connection after its
// last statement; keyBatchMax the most keys one statement creates.
var keyConnIdle = 5 * time.Second

var errPoolFull = errors.New("sqlstore: every connection of the pool is in use")

const keyBatchMax = 256

// usable reports whether the key maker may take a connection of db's
// pool: not from a pool of fewer than 4, where one held back would be a
// large share of what the application's transactions have.
func (m *keyMaker) usable(st sql.DBStats) bool {
	return st.MaxOpenConnections == 0 || st.MaxOpenConnections >= 4
}

// make returns once key's row is committed, or with the error that kept
// it from it: ctx's, when the row was not made in time (the caller then
// creates it in its transaction).
func (m *keyMaker) make(ctx context.Context, s *Store, key string) error {
	w := &keyWait{key: key, done: make(chan keyDone, 1)}
	m.mu.Lock()
	if !m.running {
		m.running = true
		m.mu.Unlock()
		return m.run(s, w)
	}
	m.waiting = append(m.waiting, w)
	m.mu.Unlock()
	select {
	case d := <-w.done:
		if d.run {
			return m.run(s, w)
		}
		return d.err
	case <-ctx.Done():
		m.mu.Lock()
		if w.run {
			// Its turn came as it gave up: the batch is its to run.
			m.mu.Unlock()
			<-w.done
			return m.run(s, w)
		}
		if i := slices.Index(m.waiting, w); i >= 0 {
			m.waiting = slices.Delete(m.waiting, i, i+1)
		} // else in the batch being run: its result is dropped
		m.mu.Unlock()
		return ctx.Err()
	}
}

// run creates the rows of self's key and of the keys waiting (up to
// keyBatchMax), tells their publishers, and passes the turn on.
func (m *keyMaker) run(s *Store, self *keyWait) error {
	m.mu.Lock()
	n := min(len(m.waiting), keyBatchMax-1)
	batch := append([]*keyWait{self}, m.waiting[:n]...)
	m.waiting = slices.Delete(m.waiting, 0, n)
	m.mu.Unlock()

	err := m.exec(s, batch)
	for _, w := range batch[1:] {
		w.done <- keyDone{err: err}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = time.Now()
	if len(m.waiting) > 0 {
		next := m.waiting[0]
		m.waiting = m.waiting[1:]
		next.run = true
		next.done <- keyDone{run: true}
		return err
	}
	m.running = false
	if m.conn != nil {
		if m.timer == nil {
			m.timer = time.AfterFunc(keyConnIdle, m.idle)
		} else {
			m.timer.Reset(keyConnIdle)
		}
	}
	return err
}

// exec inserts the batch's keys (sorted, so that two instances' batches
// lock them in the same order) with one autocommit INSERT IGNORE, within
// createKeyWait including the wait for a connection. A connection whose
// statement failed is given back to the pool, which drops it if broken.
func (m *keyMaker) exec(s *Store, batch []*keyWait) error {
	keys := make([]string, 0, len(batch))
	for _, w := range batch {
		keys = append(keys, w.key)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	ctx, cancel := context.WithTimeout(context.Background(), createKeyWait)
	defer cancel()
	if m.conn == nil {
		if poolFull(s.db.Stats()) {
			// Not waited for: every connection may be held by a
			// transaction that waits for this.
			return errPoolFull
		}
		c, err := s.db.Conn(ctx)
		if err != nil {
			return err
		}
		m.conn = c
	}
	q := `INSERT IGNORE INTO ` + s.KeysTable() + ` (ordering_key, seq, done_seq) VALUES ` +
		strings.TrimSuffix(strings.Repeat("(?, 0, 0), ", len(keys)), ", ")
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	err := s.retry(ctx, func() error {
		_, err := m.conn.ExecContext(ctx, q, args...)
		return err
	})
	if err != nil {
		m.conn.Close()
		m.conn = nil
		return err
	}
	for _, k := range keys {
		s.known.add(k)
	}
	return nil
}

// idle gives the connection back once no run used it for keyConnIdle.
func (m *keyMaker) idle() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running || m.conn == nil {
		return
	}
	if d := time.Since(m.used); d < keyConnIdle {
		m.timer.Reset(keyConnIdle - d)
		return
	}
	m.conn.Close()
	m.conn = nil
}

// keyGates holds back, in this process, the publishers of a key whose row
// a transaction of the process inserted and has not yet committed or
// rolled back (createKey could not make the row outside it): they wait
// here rather than on the row's lock, so that its rollback finds at most
// one waiter of the process on the row (two deadlock; see createKey). A
// wait lasts at most keyGateWait, so that two transactions that each wait
// for the other's gate, or for a lock the other holds, go on to the
// database, which tells such a cycle; a gate whose transaction's hooks
// never ran lapses after keyGateLapse.
type keyGates struct {
	mu sync.Mutex
	m  map[string]*keyGate
}

type keyGate struct {
	open chan struct{} // closed when the gate is released
	at   time.Time
	tx   any // the holder's transaction, if a pointer (else nil)
}

const (
	keyGateWait  = 2 * time.Second
	keyGateLapse = time.Minute
)

// txHooks is the part of the application's transaction (txctx.Tx)
// that tells when it ends.
type txHooks interface {
	AfterCommit(func())
	AfterRollback(func())
}

// busy reports whether a transaction of the process holds key's gate.
func (g *keyGates) busy(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.m[key]
	return cur != nil && time.Since(cur.at) < keyGateLapse
}

// mine reports whether tx holds key's gate: it inserted the key's row.
func (g *keyGates) mine(key string, tx any) bool {
	if !isPointer(tx) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := g.m[key]
	return cur != nil && cur.tx == tx && time.Since(cur.at) < keyGateLapse
}

func isPointer(v any) bool {
	return v != nil && reflect.TypeOf(v).Kind() == reflect.Pointer
}

// enter waits until no other transaction of the process holds key's gate
// (at most keyGateWait, or until ctx ends), then holds it for tx. The
// returned release gives it up; nil if the wait ran out (the gate is not
// held).
func (g *keyGates) enter(ctx context.Context, key string, tx any) (release func()) {
	if !isPointer(tx) {
		tx = nil
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		g.mu.Lock()
		cur := g.m[key]
		if cur == nil || time.Since(cur.at) >= keyGateLapse {
			if g.m == nil {
				g.m = map[string]*keyGate{}
			}
			mine := &keyGate{open: make(chan struct{}), at: time.Now(), tx: tx}
			g.m[key] = mine
			g.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					g.mu.Lock()
					if g.m[key] == mine {
						delete(g.m, key)
					}
					g.mu.Unlock()
					close(mine.open)
				})
			}
		}
		g.mu.Unlock()
		if t == nil {
			t = time.NewTimer(keyGateWait)
		}
		select {
		case <-cur.open:
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}
