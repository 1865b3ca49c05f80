package outbox

import (
	"reflect"
	"sync"
	"time"
)

// openNumbers remembers, per open transaction, the number each ordering
// key took in it, so that a later Publish in the same transaction numbers
// the key's next event after it (Row.KeyLast with Row.KeyLastOpen)
// instead of trying the instance's last committed number, which the
// transaction's own event has taken: that try would cost a statement,
// and the fallback two more.
//
// A transaction is known by its TxContext, if that is a pointer (others
// are not remembered). Its entry goes at its commit or rollback;
// an entry whose hooks never ran is not used after keyLastFor, and at
// most maxOpenTxs transactions are remembered.
type openNumbers struct {
	mu sync.Mutex
	m  map[TxContext]*openTx
}

type openTx struct {
	at   time.Time
	keys map[string]int64
}

const maxOpenTxs = 1 << 14

// get returns the number key took in tx, if tx is remembered.
func (o *openNumbers) get(tx TxContext, key string, now time.Time) int64 {
	if !canKey(tx) {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.m[tx]
	if t == nil || now.Sub(t.at) >= keyLastFor {
		return 0
	}
	return t.keys[key]
}

// set records that key took seq in tx; the first record of tx registers
// the hooks that forget it.
func (o *openNumbers) set(tx TxContext, key string, seq int64, now time.Time) {
	if seq <= 0 || !canKey(tx) {
		return
	}
	o.mu.Lock()
	t := o.m[tx]
	if t == nil {
		if len(o.m) >= maxOpenTxs {
			o.mu.Unlock()
			return
		}
		if o.m == nil {
			o.m = map[TxContext]*openTx{}
		}
		t = &openTx{at: now, keys: map[string]int64{}}
		o.m[tx] = t
	}
	first := len(t.keys) == 0
	t.keys[key] = max(t.keys[key], seq)
	o.mu.Unlock()
	if first {
		forget := func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.m[tx] == t {
				delete(o.m, tx)
			}
		}
		tx.AfterCommit(forget)
		tx.AfterRollback(forget)
	}
}

// canKey reports whether tx is a pointer, which identifies it.
func canKey(tx TxContext) bool {
	t := reflect.TypeOf(tx)
	return t != nil && t.Kind() == reflect.Pointer
}
