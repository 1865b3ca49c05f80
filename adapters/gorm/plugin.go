package gormoutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	"gorm.io/gorm"

	"github.com/txoutbox/txoutbox/adapters/internal/txhooks"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// PluginName is the name the plugin registers under in gorm.DB.Plugins.
const PluginName = "txoutbox"

// Plugin makes every transaction that GORM begins on a *gorm.DB an
// txctx.Tx: events published in it are written through it, and
// their after-commit hooks run only after it commits and only if the
// savepoint they were published in (if any) was not rolled back.
//
// Install it right after gorm.Open, before creating sessions, which keep
// the connection pool they were made with:
//
//	db, err := gorm.Open(dialector, &gorm.Config{})
//	...
//	err = db.Use(&gormoutbox.Plugin{})
//
// or with gorm.Config{Plugins: map[string]gorm.Plugin{gormoutbox.PluginName: &gormoutbox.Plugin{}}}.
type Plugin struct {
	// Logger receives the hooks that panicked in transactions committed or
	// rolled back by GORM (db.Transaction, Commit, Rollback). Defaults to
	// slog.Default() at the time the hooks run.
	Logger *slog.Logger
}

// Name returns PluginName.
func (*Plugin) Name() string { return PluginName }

// Initialize wraps db's connection pool; gorm.DB.Use calls it. It fails if
// the pool cannot begin transactions.
func (p *Plugin) Initialize(db *gorm.DB) error {
	cp := db.ConnPool
	if ps, ok := cp.(*gorm.PreparedStmtDB); ok {
		// PrepareStmt: true. Wrap the pool under the statement cache, so
		// that GORM still sees its own *PreparedStmtDB and *PreparedStmtTX
		// (it unwraps the latter to run its SAVEPOINT statements
		// unprepared) and our transaction sits below them.
		if _, ok := ps.ConnPool.(*pool); !ok {
			inner, err := p.wrap(ps.ConnPool)
			if err != nil {
				return err
			}
			ps.ConnPool = inner
		}
	} else if _, ok := cp.(*pool); !ok {
		wrapped, err := p.wrap(cp)
		if err != nil {
			return err
		}
		if db.Statement != nil && db.Statement.ConnPool == cp {
			db.Statement.ConnPool = wrapped
		}
		db.ConnPool = wrapped
	}
	// A SAVEPOINT statement that the user runs by hand with tx.Exec under
	// PrepareStmt goes through GORM's *PreparedStmtTX, which executes a
	// prepared statement on our transaction without calling its
	// ExecContext; this callback sees it instead.
	if db.Callback().Raw().Get(rawCallback) != nil {
		return nil
	}
	return db.Callback().Raw().After("gorm:raw").Register(rawCallback, observePreparedRaw)
}

const rawCallback = "txoutbox:savepoint"

func (p *Plugin) wrap(cp gorm.ConnPool) (*pool, error) {
	switch cp.(type) {
	case gorm.TxBeginner, gorm.ConnPoolBeginner:
		return &pool{ConnPool: cp, log: p.Logger}, nil
	}
	return nil, fmt.Errorf("gormoutbox: the connection pool %T cannot begin transactions; install the plugin on the *gorm.DB that gorm.Open returned", cp)
}

func observePreparedRaw(db *gorm.DB) {
	if db.Error != nil || db.DryRun {
		return
	}
	if ps, ok := db.Statement.ConnPool.(*gorm.PreparedStmtTX); ok {
		if c, ok := ps.Tx.(*connTx); ok {
			txhooks.Observe(&c.hooks, db.Statement.SQL.String())
		}
	}
}

// pool is the connection pool as the plugin leaves it: GORM's, with
// BeginTx returning a *connTx.
type pool struct {
	gorm.ConnPool
	log *slog.Logger
}

var (
	_ gorm.ConnPoolBeginner = (*pool)(nil)
	_ gorm.GetDBConnector   = (*pool)(nil)
)

func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var tx gorm.Tx
	switch b := p.ConnPool.(type) {
	case gorm.TxBeginner:
		stx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		tx = stx
	case gorm.ConnPoolBeginner:
		cp, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		var ok bool
		if tx, ok = cp.(gorm.Tx); !ok {
			if c, ok := cp.(gorm.TxCommitter); ok {
				_ = c.Rollback()
			}
			return nil, fmt.Errorf("gormoutbox: the connection pool's transaction %T is not a gorm.Tx", cp)
		}
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	return &connTx{Tx: tx, pool: p, ctx: ctx}, nil
}

// GetDBConn returns the *sql.DB under the pool, for gorm.DB.DB.
func (p *pool) GetDBConn() (*sql.DB, error) {
	switch c := p.ConnPool.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Ping pings the database, as gorm.Open does.
func (p *pool) Ping() error {
	db, err := p.GetDBConn()
	if err != nil {
		return err
	}
	return db.Ping()
}

// connTx is a transaction GORM began through the plugin: GORM's own
// transaction plus savepoint-aware hooks. It is what tx.Statement.ConnPool
// holds (possibly inside a *gorm.PreparedStmtTX).
type connTx struct {
	gorm.Tx
	pool  *pool
	hooks txhooks.Hooks
	ctx   context.Context // of the begin, for Hooks.End's logger
}

var (
	_ gorm.Tx             = (*connTx)(nil)
	_ gorm.GetDBConnector = (*connTx)(nil)
	_ txctx.Tx            = (*connTx)(nil)
)

// ExecContext runs the statement in the transaction and follows the
// savepoints it sets, rolls back to and releases.
func (t *connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err == nil {
		txhooks.Observe(&t.hooks, query)
	}
	return res, err
}

func (t *connTx) AfterCommit(fn func())   { t.hooks.AfterCommit(fn) }
func (t *connTx) AfterRollback(fn func()) { t.hooks.AfterRollback(fn) }

// Commit commits and then runs the hooks (txctx.Hooks.End): the after-commit
// hooks, or the after-rollback ones if the commit fails.
func (t *connTx) Commit() error { return t.hooks.End(t.ctx, t.Tx.Commit, true) }

// Rollback rolls back and runs the after-rollback hooks. After Commit it
// does nothing but return the driver's error (sql.ErrTxDone).
func (t *connTx) Rollback() error { return t.hooks.End(t.ctx, t.Tx.Rollback, false) }

func (t *connTx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// Errors.
var (
	// ErrNoTx is returned when a *gorm.DB is not in a transaction. It
	// matches outbox.ErrNoTx with errors.Is.
	ErrNoTx error = noTxError{}
	// ErrNotInstalled is returned when a *gorm.DB is in a transaction
	// that did not begin through the plugin.
	ErrNotInstalled = errors.New("gormoutbox: the transaction did not begin through the gormoutbox plugin; call db.Use(&gormoutbox.Plugin{}) right after gorm.Open, before making sessions (transactions begun inside db.Connection are not supported)")
)

type noTxError struct{}

func (noTxError) Error() string {
	return "gormoutbox: the *gorm.DB is not in a transaction; publish with the tx of db.Transaction(func(tx *gorm.DB) error { ... }), between db.Begin() and Commit, or in a handler wrapped with gormoutbox.Transactional"
}

func (noTxError) Is(target error) bool { return target == outbox.ErrNoTx }

// conn returns the plugin's transaction that tx runs in.
func conn(tx *gorm.DB) (*connTx, error) {
	if tx == nil || tx.Statement == nil {
		return nil, ErrNoTx
	}
	cp := tx.Statement.ConnPool
	if ps, ok := cp.(*gorm.PreparedStmtTX); ok {
		cp = ps.Tx
	}
	switch c := cp.(type) {
	case *connTx:
		return c, nil
	case gorm.TxCommitter:
		return nil, ErrNotInstalled
	}
	return nil, ErrNoTx
}

// installed reports whether db's connection pool is the plugin's.
func installed(db *gorm.DB) bool {
	cp := db.Statement.ConnPool
	if ps, ok := cp.(*gorm.PreparedStmtDB); ok {
		cp = ps.ConnPool
	}
	_, ok := cp.(*pool)
	return ok
}
