package middleware

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Defaults for the options.
const (
	// DefaultTimeout bounds a request's transaction, from the start of the
	// request to COMMIT.
	DefaultTimeout = 30 * time.Second
	// DefaultBeginTimeout bounds the wait for a pooled connection.
	DefaultBeginTimeout = 5 * time.Second
)

// DefaultMethods are the methods that get a transaction unless WithMethods
// says otherwise: the ones that change state.
var DefaultMethods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// Errors reported to the ErrorHandler, wrapped in an *Error.
var (
	// ErrBeginTimeout means no connection came within the begin timeout:
	// the pool is exhausted. The default ErrorHandler answers 503.
	ErrBeginTimeout = errors.New("middleware: no database connection within the begin timeout; the pool is exhausted (raise SetMaxOpenConns or WithBeginTimeout, or shed load)")
	// ErrTxTimeout means the transaction's own deadline passed before
	// COMMIT, so the database rolled it back.
	ErrTxTimeout = errors.New("middleware: transaction deadline exceeded before commit; the work was rolled back (raise WithTimeout or shorten the handler)")
	// ErrHijack is what Hijack returns in a transactional request.
	ErrHijack = errors.New("middleware: Hijack is not possible in a transactional request, whose outcome is decided by its status; serve the route outside Transactional or leave its method out of WithMethods")
)

// Error is a failure of the unit of work itself, as opposed to the
// handler's: Op is "begin" or "commit".
type Error struct {
	Op  string
	Err error
}

func (e *Error) Error() string { return "middleware: " + e.Op + " transaction: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Unit is one request's unit of work as a binding supplies it: its transaction. Embed
// txctx.Hooks for AfterCommit, AfterRollback, Committed and RolledBack.
//
// Commit and Rollback end the transaction and then run its hooks, with
// the contract of txctx.Hooks.End (which implementations call): after a
// failed COMMIT the after-rollback hooks run. The ctx given to BeginFunc
// carries the middleware's logger (txctx.Logger) for Hooks.End's report
// of hooks that panicked.
type Unit interface {
	txctx.Tx
	Commit() error
	Rollback() error
}

// BeginFunc begins a transaction. The middleware calls it at the first use
// of the request's transaction, not before the handler (see the package
// documentation). ctx is not cancelled by the client going away; it ends at the transaction's deadline, or early if the begin
// timeout passes before BeginFunc returns. The transaction must stay bound
// to ctx (database/sql's BeginTx does this), so that the deadline rolls it
// back. opts is never nil.
type BeginFunc func(ctx context.Context, opts *sql.TxOptions) (Unit, error)

// CommitPolicy decides from the response status whether to commit.
type CommitPolicy func(status int) bool

// Commit2xx is the default CommitPolicy: commit on 200–299.
func Commit2xx(status int) bool { return status >= 200 && status < 300 }

// ErrorHandler answers a request whose transaction could not begin or
// commit; err is an *Error. It writes to the real response writer, which
// holds none of the handler's output.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// DefaultErrorHandler answers 503 with Retry-After when the transaction
// could not begin, and 500 when it could not commit, with the status text
// as the body. It never reveals err to the client.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	if e, ok := errors.AsType[*Error](err); ok && e.Op == "begin" {
		code = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, http.StatusText(code), code)
}

// Option configures New.
type Option func(*config)

type config struct {
	ob           *outbox.Outbox
	txOpts       sql.TxOptions
	methods      map[string]bool
	timeout      time.Duration
	beginTimeout time.Duration
	policy       CommitPolicy
	stream       func(*http.Request) bool
	onError      ErrorHandler
	log          *slog.Logger
}

// WithOutbox puts ob into every request's context with outbox.NewContext,
// so that outbox.Publish(r.Context(), env) uses it. Without it, Publish
// uses the outbox set with outbox.SetDefault.
func WithOutbox(ob *outbox.Outbox) Option {
	if ob == nil {
		panic("middleware: WithOutbox: outbox is nil")
	}
	return func(c *config) { c.ob = ob }
}

// WithIsolation sets the isolation level of the transactions. Defaults to
// the database's default (sql.LevelDefault).
func WithIsolation(level sql.IsolationLevel) Option {
	return func(c *config) { c.txOpts.Isolation = level }
}

// WithReadOnly makes the transactions read-only, for routes that only read
// but want one snapshot (use with WithMethods). outbox.Publish fails in a
// read-only transaction. The modernc SQLite driver ignores it (and any
// isolation level). Defaults to false.
func WithReadOnly(readOnly bool) Option {
	return func(c *config) { c.txOpts.ReadOnly = readOnly }
}

// WithMethods sets the HTTP methods that get a transaction; requests with
// other methods pass through untouched. Defaults to DefaultMethods (POST,
// PUT, PATCH, DELETE); see the package documentation for why.
func WithMethods(methods ...string) Option {
	if len(methods) == 0 {
		panic("middleware: WithMethods needs at least one method")
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		if m == "" || strings.ToUpper(m) != m {
			panic(fmt.Sprintf("middleware: WithMethods: %q is not an upper-case HTTP method", m))
		}
		set[m] = true
	}
	return func(c *config) { c.methods = set }
}

// WithTimeout bounds each transaction, from the start of the request to
// COMMIT; past it the database rolls the work back. It is the deadline of
// the context the handler sees. Defaults to DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("middleware: WithTimeout(%v): the timeout must be positive", d))
	}
	return func(c *config) { c.timeout = d }
}

// WithBeginTimeout bounds the wait for a connection when the pool is
// exhausted; past it the request is answered by the ErrorHandler with an
// error matching ErrBeginTimeout (503 by default) and the handler goes no
// further than its first use of the transaction. Defaults to
// DefaultBeginTimeout.
func WithBeginTimeout(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("middleware: WithBeginTimeout(%v): the timeout must be positive", d))
	}
	return func(c *config) { c.beginTimeout = d }
}

// WithCommitPolicy sets which statuses commit. Defaults to Commit2xx.
func WithCommitPolicy(p CommitPolicy) Option {
	if p == nil {
		panic("middleware: WithCommitPolicy: policy is nil")
	}
	return func(c *config) { c.policy = p }
}

// WithStreaming makes the requests for which match reports true stream
// their responses instead of buffering them (see the package
// documentation for what that gives up). Defaults to buffering every
// transactional request.
func WithStreaming(match func(r *http.Request) bool) Option {
	if match == nil {
		panic("middleware: WithStreaming: match is nil")
	}
	return func(c *config) { c.stream = match }
}

// WithErrorHandler sets what answers a request whose transaction could not
// begin or commit. Defaults to DefaultErrorHandler.
func WithErrorHandler(h ErrorHandler) Option {
	if h == nil {
		panic("middleware: WithErrorHandler: handler is nil")
	}
	return func(c *config) { c.onError = h }
}

// WithLogger sets where failed begins and commits, failed rollbacks and
// panicking hooks are logged. Payloads are never logged. Defaults to
// slog.Default() at the time New is called.
func WithLogger(l *slog.Logger) Option {
	if l == nil {
		panic("middleware: WithLogger: logger is nil")
	}
	return func(c *config) { c.log = l }
}

// Middleware runs each request with a transactional method as one unit of
// work. It is safe for concurrent use.
type Middleware struct {
	begin BeginFunc
	cfg   config
}

// New returns the middleware for begin. It panics if begin is nil.
func New(begin BeginFunc, opts ...Option) *Middleware {
	if begin == nil {
		panic("middleware: New: begin function is nil")
	}
	var c config
	for _, o := range opts {
		if o == nil {
			panic("middleware: New: nil Option")
		}
		o(&c)
	}
	if c.methods == nil {
		c.methods = make(map[string]bool, len(DefaultMethods))
		for _, m := range DefaultMethods {
			c.methods[m] = true
		}
	}
	c.timeout = cmp.Or(c.timeout, DefaultTimeout)
	c.beginTimeout = cmp.Or(c.beginTimeout, DefaultBeginTimeout)
	if c.policy == nil {
		c.policy = Commit2xx
	}
	if c.onError == nil {
		c.onError = DefaultErrorHandler
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return &Middleware{begin: begin, cfg: c}
}

type clientKey struct{}

// ClientContext returns the context of the client's request: it is
// cancelled when the client goes away, unlike the context a transactional
// handler sees. Outside a transactional request it returns ctx.
func ClientContext(ctx context.Context) context.Context {
	if c, ok := ctx.Value(clientKey{}).(context.Context); ok {
		return c
	}
	return ctx
}

// noTxReason says why a request of method gets no transaction, for the
// error of a Publish in its handler.
func (m *Middleware) noTxReason(method string) string {
	methods := make([]string, 0, len(m.cfg.methods))
	for k := range m.cfg.methods {
		methods = append(methods, k)
	}
	sort.Strings(methods)
	return fmt.Sprintf("the middleware opens transactions for %s only, and this is a %s request (GET and HEAD get none by default: they are safe methods); to publish from it, add %s with WithMethods", strings.Join(methods, ", "), method, method)
}

// Handler wraps next; it has the signature chi's Use and Route expect.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.cfg.ob != nil {
			r = r.WithContext(outbox.NewContext(r.Context(), m.cfg.ob))
		}
		if !m.cfg.methods[r.Method] {
			if _, ok := txctx.From(r.Context()); !ok {
				r = r.WithContext(txctx.Without(r.Context(), m.noTxReason(r.Method)))
			}
			next.ServeHTTP(w, r)
			return
		}
		if _, ok := txctx.From(r.Context()); ok {
			next.ServeHTTP(w, r) // join the request's transaction
			return
		}
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	client := r.Context()
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(client), clientKey{}, client), m.cfg.timeout)
	defer cancel()
	// The transaction reports hooks that panic with this logger.
	ctx = txctx.WithLogger(ctx, slog.New(&requestLog{Handler: m.cfg.log.Handler(), method: r.Method, path: r.URL.Path}))

	// The transaction begins at its first use, not here: see lazyTx.
	tx := &lazyTx{m: m, ctx: ctx, r: r}
	tr := r.WithContext(txctx.With(ctx, tx))

	if m.cfg.stream != nil && m.cfg.stream(r) {
		m.serveStreamed(w, r, tr, next, tx)
		return
	}

	bw := getBuffer(w)
	defer putBuffer(bw)
	done := false
	defer func() {
		if !done { // a panic or runtime.Goexit: roll back and let it go on
			m.rollback(tr, tx)
			if tx.failed() != nil {
				m.recoverBegin(w, r, tx, recover(), false)
			}
		}
	}()
	next.ServeHTTP(bw, tr)
	done = true

	if err := tx.failed(); err != nil {
		// The transaction could not begin: whatever the handler answered
		// (perhaps a 2xx, having ignored a Publish error), its work is
		// not in the database.
		m.rollback(tr, tx)
		m.cfg.onError(w, r, err)
		return
	}
	status := bw.statusCode()
	if !m.cfg.policy(status) {
		m.rollback(tr, tx)
		bw.sendTo(w, r)
		return
	}
	if err := m.commit(tr, tx); err != nil {
		m.cfg.onError(w, r, &Error{Op: "commit", Err: err})
		return
	}
	bw.sendTo(w, r)
}

// recoverBegin handles v, what the handler's deferred function
// recovered after the begin of tx failed: it answers with the
// ErrorHandler if v is that failure (an accessor such as txmw.Tx panics
// with it, the handler having no way to go on), and panics again with
// any other value. With sent (a streamed response has begun) it aborts
// the connection instead of answering. (While the begin has not failed,
// nothing is recovered: a panic goes on untouched.)
func (m *Middleware) recoverBegin(w http.ResponseWriter, r *http.Request, tx *lazyTx, v any, sent bool) {
	berr := tx.failed()
	if v == nil {
		return // runtime.Goexit
	}
	if e, ok := v.(error); !ok || !errors.Is(e, berr) {
		panic(v)
	}
	if sent {
		panic(http.ErrAbortHandler)
	}
	m.cfg.onError(w, r, berr)
}

func (m *Middleware) serveStreamed(w http.ResponseWriter, r, tr *http.Request, next http.Handler, tx *lazyTx) {
	sw := &streamWriter{w: w}
	done := false
	defer func() {
		if !done {
			m.rollback(tr, tx)
			if tx.failed() != nil {
				m.recoverBegin(w, r, tx, recover(), sw.status != 0)
			}
		}
	}()
	next.ServeHTTP(sw, tr)
	done = true

	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if err := tx.failed(); err != nil {
		m.rollback(tr, tx)
		switch {
		case sw.status == 0: // nothing sent yet: answer properly
			m.cfg.onError(w, r, err)
		case m.cfg.policy(status):
			panic(http.ErrAbortHandler) // a success is out, and nothing was written
		}
		return
	}
	if !m.cfg.policy(status) {
		m.rollback(tr, tx)
		return
	}
	if err := m.commit(tr, tx); err != nil {
		if sw.status == 0 { // nothing sent yet: answer properly
			m.cfg.onError(w, r, &Error{Op: "commit", Err: err})
			return
		}
		// The status is out; make the client see a broken response rather
		// than a clean one.
		panic(http.ErrAbortHandler)
	}
}

// beginTx calls begin with ctx, cancelling it if begin takes longer than
// the begin timeout.
func (m *Middleware) beginTx(ctx context.Context) (Unit, error) {
	bctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(m.cfg.beginTimeout, func() { cancel(ErrBeginTimeout) })
	opts := m.cfg.txOpts
	tx, err := m.begin(bctx, &opts)
	if t.Stop() {
		// bctx lives on, bound to the transaction, until ctx ends.
		if err != nil {
			cancel(nil)
			return nil, err
		}
		if tx == nil {
			cancel(nil)
			return nil, errors.New("middleware: BeginFunc returned neither a transaction nor an error")
		}
		return tx, nil
	}
	// The timer fired: whatever begin returned, its context is gone.
	if err == nil && tx != nil {
		_ = tx.Rollback()
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrBeginTimeout) {
		return nil, fmt.Errorf("%w (after %v): %w", ErrBeginTimeout, m.cfg.beginTimeout, err)
	}
	if ctx.Err() != nil { // the transaction deadline itself is shorter
		return nil, fmt.Errorf("%w: %w", ErrTxTimeout, context.Cause(ctx))
	}
	return nil, fmt.Errorf("%w (after %v)", ErrBeginTimeout, m.cfg.beginTimeout)
}

// commit commits tx and runs the hooks of the outcome; it returns the
// commit error.
func (m *Middleware) commit(r *http.Request, tx Unit) error {
	ctx := r.Context()
	var err error
	if ctx.Err() != nil {
		// Past the deadline database/sql may or may not have rolled back
		// yet; never commit then, so the outcome does not depend on a race.
		_ = tx.Rollback()
		err = fmt.Errorf("%w (%v): %w", ErrTxTimeout, m.cfg.timeout, context.Cause(ctx))
	} else if err = tx.Commit(); err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%v): %w", ErrTxTimeout, m.cfg.timeout, context.Cause(ctx))
	}
	if err != nil {
		m.cfg.log.LogAttrs(ClientContext(r.Context()), slog.LevelError, "middleware: commit failed; the request's work is rolled back",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		return err
	}
	return nil
}

func (m *Middleware) rollback(r *http.Request, tx Unit) {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		m.cfg.log.LogAttrs(ClientContext(r.Context()), slog.LevelWarn, "middleware: rollback failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
}

// requestLog is the logger of a request's hook reports: the middleware's,
// with the request's method and path added when a record is written, not
// up front as Logger.With would (which formats them on every request,
// about a sixth of the middleware's allocations, for reports that are
// almost never written).
type requestLog struct {
	slog.Handler
	method, path string
}

func (h *requestLog) attrs() []slog.Attr {
	return []slog.Attr{slog.String("method", h.method), slog.String("path", h.path)}
}

func (h *requestLog) Handle(ctx context.Context, r slog.Record) error {
	r.AddAttrs(h.attrs()...)
	return h.Handler.Handle(ctx, r)
}

func (h *requestLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &requestLog{Handler: h.Handler.WithAttrs(as), method: h.method, path: h.path}
}

func (h *requestLog) WithGroup(name string) slog.Handler {
	return h.Handler.WithAttrs(h.attrs()).WithGroup(name)
}
