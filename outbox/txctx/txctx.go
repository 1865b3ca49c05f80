// Package txctx is the contract between a transaction type and the
// outbox: how a transaction rides in a context.Context, what it must
// offer (Tx), and the bookkeeping of its after-commit and after-rollback
// hooks (Hooks). Middleware, ORM adapters and test stores use it;
// application code does not need it: outbox.Publish, outbox.AfterCommit
// and outbox.BeginTx are the application's side.
//
// A transaction type embeds Hooks and ends with Hooks.End:
//
//	type gormTx struct {
//		ctx context.Context
//		db  *gorm.DB
//		txctx.Hooks // AfterCommit, AfterRollback
//	}
//
//	func (t *gormTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
//		return t.db.Statement.ConnPool.ExecContext(ctx, q, args...)
//	}
//	func (t *gormTx) Commit() error {
//		return t.End(t.ctx, func() error { return t.db.Commit().Error }, true)
//	}
//	func (t *gormTx) Rollback() error {
//		return t.End(t.ctx, func() error { return t.db.Rollback().Error }, false)
//	}
//
// and goes into the request's context with With, where outbox.Publish
// finds it (From).
package txctx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

// Tx is an open transaction as the outbox sees it: something to write the
// event row through, and a place to register work that must run only
// after the transaction commits (or only after it rolls back).
//
// Implementations run after-commit hooks only after a successful commit,
// in registration order, and discard them on rollback; and the reverse for
// after-rollback hooks. Hooks does the bookkeeping.
type Tx interface {
	driver.Execer
	AfterCommit(fn func())
	AfterRollback(fn func())
}

type txKey struct{}

// With returns a copy of ctx that carries tx, so that outbox.Publish(ctx,
// …) writes through it.
func With(ctx context.Context, tx Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// From returns the transaction carried by ctx, if any. It may be a Lazy
// transaction that has not begun yet: AfterCommit and AfterRollback on it
// begin nothing, ExecContext begins it. An accessor that hands the
// transaction itself to its caller resolves it with Begun first.
func From(ctx context.Context) (Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(Tx)
	return tx, ok && tx != nil
}

// Lazy is a Tx whose transaction begins at its first use, so that it holds
// a pooled connection only from its first statement to its end: package
// middleware puts one into each transactional request. Its ExecContext
// begins it; AfterCommit and AfterRollback before the begin are kept and
// handed to the transaction when it begins (or run at the request's end if
// it never begins). outbox.Publish begins it before writing and writes
// through the transaction it returns.
type Lazy interface {
	Tx
	// Begin begins the transaction unless it has begun, and returns it;
	// every call returns the same transaction, or the same error if the
	// begin failed (after the end of the unit of work: sql.ErrTxDone).
	Begin() (Tx, error)
}

// Begun returns tx, or the transaction a Lazy one begins (see Lazy.Begin).
// Accessors of middleware bindings (txmw.Tx, gormoutbox.DB, entoutbox.Tx)
// call it before handing the transaction out.
func Begun(tx Tx) (Tx, error) {
	if l, ok := tx.(Lazy); ok {
		return l.Begin()
	}
	return tx, nil
}

type noTxKey struct{}

// Without returns a copy of ctx that says why it carries no transaction on
// purpose; outbox.Publish then fails with an error that wraps
// outbox.ErrNoTx and gives that reason instead of the generic advice.
// Middleware calls it for requests it lets through without a transaction
// (GET and HEAD by default).
func Without(ctx context.Context, reason string) context.Context {
	return context.WithValue(ctx, noTxKey{}, reason)
}

// WhyWithout returns the reason Without put in ctx, or "".
func WhyWithout(ctx context.Context) string {
	reason, _ := ctx.Value(noTxKey{}).(string)
	return reason
}

type loggerKey struct{}

// WithLogger returns a copy of ctx that carries log for the report of
// panicking hooks by Hooks.End (middleware puts its own there, with the
// request's method and path).
func WithLogger(ctx context.Context, log *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, log)
}

// Logger returns the logger WithLogger put in ctx, or slog.Default().
func Logger(ctx context.Context) *slog.Logger {
	if ctx != nil {
		if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok && l != nil {
			return l
		}
	}
	return slog.Default()
}

// Hooks keeps the after-commit and after-rollback callbacks of one
// transaction, following its savepoints. The zero value is ready to use;
// it is safe for concurrent use. Implementations of Tx embed it and
// call Committed or RolledBack once the outcome is known.
//
// Savepoints matter because an event published inside a savepoint that is
// rolled back left no row: its after-commit hook must never run, even if
// the transaction commits. An implementation that lets callers use
// savepoints reports them with Savepoint, RollbackToSavepoint and ReleaseSavepoint:
//
//   - RollbackToSavepoint(s) drops the after-commit hooks registered since s was
//     set, and makes the after-rollback hooks registered since then due:
//     they run when the transaction ends, whatever its outcome. s itself
//     stays, as in SQL.
//   - ReleaseSavepoint(s) merges what was registered since s into the enclosing
//     level.
//   - Committed runs the surviving after-commit hooks and the due
//     after-rollback hooks in registration order; RolledBack runs every
//     after-rollback hook.
//
// Savepoint names form a stack: when a name repeats, the most recent one
// counts.
type Hooks struct {
	mu      sync.Mutex
	entries []hookEntry
	marks   []savepointMark
	done    bool
}

type hookEntry struct {
	fn     func()
	commit bool // an after-commit hook; else an after-rollback hook
	due    bool // an after-rollback hook whose savepoint was rolled back
}

type savepointMark struct {
	name string
	at   int // len(entries) when the savepoint was set
}

// AfterCommit registers fn to run after a successful commit, unless the
// savepoint it was registered in is rolled back first. Registered after
// the outcome is known, fn is dropped: that is a programming error the
// caller can detect with Ended.
func (h *Hooks) AfterCommit(fn func()) { h.add(hookEntry{fn: fn, commit: true}) }

// AfterRollback registers fn to run after the transaction rolls back, or
// when it ends at all if the savepoint it was registered in is rolled back.
func (h *Hooks) AfterRollback(fn func()) { h.add(hookEntry{fn: fn}) }

func (h *Hooks) add(e hookEntry) {
	if e.fn == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.entries = append(h.entries, e)
	}
}

// Savepoint records that the savepoint name was set.
func (h *Hooks) Savepoint(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.done {
		h.marks = append(h.marks, savepointMark{name: name, at: len(h.entries)})
	}
}

// RollbackToSavepoint records a rollback to the savepoint name and reports whether
// the savepoint was known.
func (h *Hooks) RollbackToSavepoint(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.find(name)
	if i < 0 {
		return false
	}
	at := h.marks[i].at
	kept := h.entries[:at]
	for _, e := range h.entries[at:] {
		if !e.commit {
			e.due = true
			kept = append(kept, e)
		}
	}
	clear(h.entries[len(kept):])
	h.entries = kept
	h.marks = h.marks[:i+1]
	return true
}

// ReleaseSavepoint records that the savepoint name was released and reports
// whether it was known.
func (h *Hooks) ReleaseSavepoint(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := h.find(name)
	if i < 0 {
		return false
	}
	h.marks = h.marks[:i]
	return true
}

func (h *Hooks) find(name string) int {
	for i := len(h.marks) - 1; i >= 0; i-- {
		if h.marks[i].name == name {
			return i
		}
	}
	return -1
}

// Depth returns the number of open savepoints.
func (h *Hooks) Depth() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.marks)
}

// Ended reports whether Committed or RolledBack has been called.
func (h *Hooks) Ended() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

// Committed runs the surviving after-commit hooks and the after-rollback
// hooks of rolled-back savepoints, in registration order, each under its
// own recover. A panicking hook does not stop the others; the returned
// error joins one *PanicError per panic. Only the first of Committed
// and RolledBack does anything.
func (h *Hooks) Committed() error { return h.fire(true) }

// RolledBack runs every after-rollback hook, in registration order, like
// Committed.
func (h *Hooks) RolledBack() error { return h.fire(false) }

func (h *Hooks) fire(committed bool) error {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return nil
	}
	h.done = true
	entries := h.entries
	h.entries, h.marks = nil, nil
	h.mu.Unlock()
	var errs []error
	for i, e := range entries {
		run := !e.commit // rolled back: every after-rollback hook
		if committed {
			run = e.commit || e.due
		}
		if !run {
			continue
		}
		if err := runHook(e.fn); err != nil {
			err.Index = i
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PanicError reports a hook that panicked.
type PanicError struct {
	Index int // position of the hook among all hooks, in registration order
	Value any // what it panicked with
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("outbox: transaction hook %d panicked: %v", e.Index, e.Value)
}

func runHook(fn func()) (perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			perr = &PanicError{Value: v}
		}
	}()
	fn()
	return nil
}

// End ends a transaction and runs its hooks: the one contract of every
// transaction type of this module (outbox.Tx, the transactions of txmw,
// the GORM and ent adapters, outboxtest), so that their Commit and
// Rollback mean the same thing. end is the transaction's own Commit
// (commit true) or Rollback (commit false):
//
//   - Commit: after a successful COMMIT the after-commit hooks run; if the
//     COMMIT fails, the transaction is over anyway (the database rolled it
//     back), so the after-rollback hooks run, and the COMMIT's error is
//     returned.
//   - Rollback: the after-rollback hooks run whatever ROLLBACK returns
//     (sql.ErrTxDone without a Commit means database/sql already rolled
//     back for a cancelled context: the hooks are still due), and its
//     error is returned.
//
// Hooks run once: a second End runs none. A hook that panics does not
// stop the others; the panics are logged with the logger WithLogger put in
// ctx (slog.Default() otherwise), never returned, so that a Commit that
// succeeded never reports a hook's failure as its own.
func (h *Hooks) End(ctx context.Context, end func() error, commit bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	err := end()
	kind, herr := "after-rollback", error(nil)
	if commit && err == nil {
		kind, herr = "after-commit", h.Committed()
	} else {
		herr = h.RolledBack()
	}
	if herr != nil {
		Logger(ctx).LogAttrs(ctx, slog.LevelError, "outbox: "+kind+" hook panicked; the other hooks ran", slog.Any("error", herr))
	}
	return err
}
