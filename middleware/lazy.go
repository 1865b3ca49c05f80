package middleware

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"sync"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// lazyTx is the transaction a request's context carries: it begins at
// its first use (txctx.Begun from a binding's accessor, or an
// ExecContext such as Publish's), so that a request holds a pooled
// connection only from its first statement to its end, and a request
// that never uses it opens none. A handler that reads a slow client's
// body before its first statement holds no connection meanwhile.
type lazyTx struct {
	m   *Middleware
	ctx context.Context // the transaction's: deadline, logger, client
	r   *http.Request   // for the log of a failed begin

	mu      sync.Mutex
	unit    Unit  // once begun
	err     error // of a failed begin: an *Error with Op "begin"
	ended   bool
	pending []pendingHook // registered before the begin
}

type pendingHook struct {
	fn     func()
	commit bool
}

var _ txctx.Lazy = (*lazyTx)(nil)

// Begin begins the transaction, with the begin timeout, unless it has
// begun or failed to; a failure is logged once and kept.
func (l *lazyTx) Begin() (txctx.Tx, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.unit != nil:
		return l.unit, nil
	case l.err != nil:
		return nil, l.err
	case l.ended:
		return nil, sql.ErrTxDone
	}
	u, err := l.m.beginTx(l.ctx)
	if err != nil {
		l.m.cfg.log.LogAttrs(ClientContext(l.ctx), slog.LevelWarn, "middleware: begin transaction failed",
			slog.String("method", l.r.Method), slog.String("path", l.r.URL.Path), slog.Any("error", err))
		l.err = &Error{Op: "begin", Err: err}
		return nil, l.err
	}
	for _, h := range l.pending {
		if h.commit {
			u.AfterCommit(h.fn)
		} else {
			u.AfterRollback(h.fn)
		}
	}
	l.pending, l.unit = nil, u
	return u, nil
}

// ExecContext begins the transaction and runs the statement in it.
func (l *lazyTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	u, err := l.Begin()
	if err != nil {
		return nil, err
	}
	return u.ExecContext(ctx, query, args...)
}

func (l *lazyTx) AfterCommit(fn func())   { l.hook(fn, true) }
func (l *lazyTx) AfterRollback(fn func()) { l.hook(fn, false) }

func (l *lazyTx) hook(fn func(), commit bool) {
	if fn == nil {
		return
	}
	l.mu.Lock()
	u := l.unit
	if u == nil && !l.ended {
		l.pending = append(l.pending, pendingHook{fn: fn, commit: commit})
	}
	l.mu.Unlock()
	switch {
	case u != nil && commit:
		u.AfterCommit(fn)
	case u != nil:
		u.AfterRollback(fn)
	}
}

// failed returns the error of a begin that failed, or nil.
func (l *lazyTx) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// end ends the unit of work: it commits or rolls back the transaction if
// it began, and otherwise runs the hooks of the outcome (a transaction
// that ran no statement commits trivially). No begin follows.
func (l *lazyTx) end(commit bool) error {
	l.mu.Lock()
	u, pending := l.unit, l.pending
	l.ended, l.pending = true, nil
	l.mu.Unlock()
	if u != nil {
		if commit {
			return u.Commit()
		}
		return u.Rollback()
	}
	var h txctx.Hooks
	for _, p := range pending {
		if p.commit {
			h.AfterCommit(p.fn)
		} else {
			h.AfterRollback(p.fn)
		}
	}
	return h.End(l.ctx, func() error { return nil }, commit)
}

func (l *lazyTx) Commit() error   { return l.end(true) }
func (l *lazyTx) Rollback() error { return l.end(false) }
