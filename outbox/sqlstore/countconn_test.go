package sqlstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// countedDB opens the named test database (as testdb.Open) through a
// connector that counts the transactions begun on it.
func countedDB(t *testing.T, name string) (*sqlx.DB, *atomic.Int64) {
	t.Helper()
	probe := testdb.Open(t, name) // skips, or fails in CI, without the server
	dsn, driverName := "", probe.DriverName()
	switch name {
	case "mysql":
		dsn = testdb.MySQLDSN()
	case "postgres":
		dsn = testdb.PostgresDSN()
	default:
		dsn = sqlstore.SQLiteDSN(filepath.Join(t.TempDir(), "counted.db"))
	}
	begins := &atomic.Int64{}
	db := sqlx.NewDb(sql.OpenDB(countingConnector{drv: probe.Driver(), dsn: dsn, begins: begins}), driverName)
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	return db, begins
}

type countingConnector struct {
	drv    driver.Driver
	dsn    string
	begins *atomic.Int64
}

func (c countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, begins: c.begins}, nil
}

func (c countingConnector) Driver() driver.Driver { return c.drv }

// countingConn counts BeginTx and passes everything else through; what
// the driver's connection does not implement, it says so (ErrSkip), as
// database/sql expects.
type countingConn struct {
	driver.Conn
	begins *atomic.Int64
}

func (c *countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.begins.Add(1)
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return c.Conn.Begin() //nolint:staticcheck // the driver has nothing else
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, q)
	}
	return c.Conn.Prepare(q)
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := c.Conn.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, q, args)
	}
	return nil, driver.ErrSkip
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	if e, ok := c.Conn.(driver.QueryerContext); ok {
		return e.QueryContext(ctx, q, args)
	}
	return nil, driver.ErrSkip
}

func (c *countingConn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}
