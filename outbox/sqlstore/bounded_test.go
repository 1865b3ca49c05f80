package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// A claim's read that outlives the engine's deadline is stopped by the
// MySQL/MariaDB server itself: the driver only closes the connection when
// a context ends, and the server would go on with the statement. The
// statement runs here under a context that does not end, so that only the
// server can stop it: unbounded, SLEEP(5) returns 0 after five seconds.
// (PostgreSQL and SQLite stop a statement when its context ends: pgx
// sends a cancel request, SQLite runs in the process.)
func TestBoundedStatementIsStoppedByTheServer(t *testing.T) {
	st := testdb.Store(t, testdb.Open(t, "mysql"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	q := sqlstore.Bounded(st, ctx, `SELECT SLEEP(5)`)
	var slept int
	err := st.DB().QueryRowContext(context.WithoutCancel(ctx), q).Scan(&slept)
	if err == nil && slept == 0 {
		t.Fatalf("%s ran to its end", q)
	}
	t.Logf("%s: %v (SLEEP returned %d)", q, err, slept)
}
