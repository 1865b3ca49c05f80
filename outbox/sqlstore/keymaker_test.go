package sqlstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Many publishers asking at once for the rows of new keys (MySQL's key
// maker): each gets its key's row, committed, through statements run one
// at a time on one connection, and a publisher that stops waiting (its
// deadline passed) stops nobody else.
func TestKeyMakerMakesEveryKeyAskedAtOnce(t *testing.T) {
	db := testdb.Open(t, "mysql")
	st := testdb.Store(t, db)
	const (
		askers = 64
		each   = 20
		keys   = 300
	)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, askers*each)
	for a := range askers {
		wg.Go(func() {
			for i := range each {
				key := "k" + strconv.Itoa((a*each+i*7)%keys)
				if a%8 == 0 {
					// Gives up at once: may leave its key made or not.
					gone, cancel := context.WithCancel(ctx)
					cancel()
					sqlstore.MakeKey(gone, st, key+"-x")
				}
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if err := sqlstore.MakeKey(wctx, st, key); err != nil {
					errs <- err
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("MakeKey: %v", err)
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM `+st.KeysTable()+` WHERE ordering_key NOT LIKE '%-x' AND seq = 0`); err != nil {
		t.Fatal(err)
	}
	if n != keys {
		t.Errorf("%d key rows made, want %d", n, keys)
	}
	if used := db.Stats().InUse; used > 1 {
		t.Errorf("%d connections in use after the makes, want at most the key maker's", used)
	}
}
