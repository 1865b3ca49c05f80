package sqlstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"
)

// flavor is what a MySQL-dialect server is, for the statements whose
// syntax differs: MariaDB or MySQL proper.
type flavor int

const (
	flavorUnknown flavor = iota
	flavorMariaDB
	flavorMySQL
)

// serverFlavor looks up, once, whether the MySQL-dialect server is
// MariaDB (its VERSION() says so) or MySQL. A failed lookup is tried again
// at the next call.
type serverFlavor struct {
	mu sync.Mutex
	f  flavor
}

func (s *Store) flavor(ctx context.Context) flavor {
	s.srv.mu.Lock()
	defer s.srv.mu.Unlock()
	if s.srv.f == flavorUnknown {
		var v string
		if err := s.db.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&v); err == nil {
			s.srv.f = flavorMySQL
			if strings.Contains(strings.ToLower(v), "mariadb") {
				s.srv.f = flavorMariaDB
			}
		}
	}
	return s.srv.f
}

// bounded returns q, a SELECT, limited on the server to the time left
// before ctx's deadline (MySQL dialect only; q unchanged otherwise, or
// without a deadline). When a context ends, go-sql-driver/mysql closes
// the connection, but the server goes on with the statement until it
// has rows to send: a claim that cannot finish in time (a pathological
// plan, a table far larger than expected) would otherwise keep running
// for minutes after the engine gave up on it, each poll adding one more.
// PostgreSQL (pgx sends a cancel request) and SQLite (in process) stop
// by themselves.
func (s *Store) bounded(ctx context.Context, q string) string {
	if s.d.name != "mysql" {
		return q
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return q
	}
	left := max(time.Until(deadline), time.Millisecond)
	switch s.flavor(ctx) {
	case flavorMariaDB:
		return `SET STATEMENT max_statement_time = ` + strconv.FormatFloat(left.Seconds(), 'f', 3, 64) + ` FOR ` + q
	case flavorMySQL:
		if rest, ok := strings.CutPrefix(q, `SELECT `); ok {
			return `SELECT /*+ MAX_EXECUTION_TIME(` + strconv.FormatInt(left.Milliseconds(), 10) + `) */ ` + rest
		}
	}
	return q
}
