// Package middleware runs each HTTP request as one unit of work: it gives
// the handler a transaction that begins at its first use, buffers the
// handler's response, commits when the status says so, and only then runs
// the after-commit hooks (which hand published events to the outbox
// dispatcher) and sends the response.
//
// It knows nothing of SQL libraries or routers. Package txmw binds it to
// database/sql and sqlx; the GORM and ent adapters bind it to theirs. Each
// binding supplies only a [BeginFunc]; everything about HTTP lives here.
//
// # Using it from a binding
//
// A binding's transaction implements [Unit]: the [txctx.Tx] that
// outbox.Publish writes through, plus Commit and Rollback. Embedding
// [txctx.Hooks] provides the hook methods:
//
//	type gormTx struct {
//		ctx context.Context
//		db  *gorm.DB
//		txctx.Hooks // AfterCommit, AfterRollback, Committed, RolledBack
//	}
//
//	func (t *gormTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
//		return t.db.Statement.ConnPool.ExecContext(ctx, q, args...)
//	}
//	func (t *gormTx) Commit() error {
//		return t.Hooks.End(t.ctx, func() error { return t.db.Commit().Error }, true)
//	}
//	func (t *gormTx) Rollback() error {
//		return t.Hooks.End(t.ctx, func() error { return t.db.Rollback().Error }, false)
//	}
//
//	func Transactional(db *gorm.DB, opts ...middleware.Option) func(http.Handler) http.Handler {
//		begin := func(ctx context.Context, o *sql.TxOptions) (middleware.Unit, error) {
//			tx := db.WithContext(ctx).Begin(o)
//			if tx.Error != nil {
//				return nil, tx.Error
//			}
//			return &gormTx{ctx: ctx, db: tx}, nil
//		}
//		return middleware.New(begin, opts...).Handler
//	}
//
// The middleware puts a lazy transaction ([txctx.Lazy]) into the
// request context with [txctx.With], and calls the BeginFunc at
// its first use (see "When the transaction begins"). The binding's
// accessor finds it with [txctx.From], begins it with
// [txctx.Begun], and asserts its own type on the result:
//
//	func DB(ctx context.Context) *gorm.DB {
//		t, ok := txctx.From(ctx)
//		if !ok {
//			panic("no transaction: mount the route inside Transactional")
//		}
//		t, err := txctx.Begun(t)
//		if err != nil {
//			panic(err) // the pool is exhausted: the middleware answers 503
//		}
//		return t.(*gormTx).db
//	}
//
// An accessor that cannot return an error panics with the begin's error
// as is: the middleware recovers that panic (and no other) and answers
// with the [ErrorHandler]. Commit and
// Rollback end the transaction and run its hooks through [txctx.Hooks.End],
// the one contract of every transaction of this module (after a failed
// COMMIT the after-rollback hooks run); the ctx given to the BeginFunc
// carries the middleware's logger, with which Hooks.End reports hooks that
// panic.
//
// # What a client can rely on
//
// A 2xx that the client sees means the data is committed. The status,
// headers and body the handler writes are buffered; after the handler
// returns, the middleware commits if the [CommitPolicy] accepts the status
// (by default [Commit2xx]) and rolls back otherwise. On a successful commit
// the after-commit hooks run, in registration order, each under its own
// recover, and then the buffered response goes out. If COMMIT fails, the
// after-rollback hooks run, none of the handler's response is sent, and the
// [ErrorHandler] answers instead (by default 500). A rolled-back request's
// buffered response goes out unchanged after the after-rollback hooks.
//
// A body written without WriteHeader is an implicit 200, as in net/http; so
// is a handler that writes nothing. Informational (1xx) statuses are
// dropped while buffering.
//
// A panic in the handler rolls back, runs the after-rollback hooks, sends
// nothing of the buffered response, and re-panics with the same value, so
// that a recoverer further out (chi's middleware.Recoverer) still sees it.
//
// # Which requests get a transaction
//
// By default POST, PUT, PATCH and DELETE. GET, HEAD, OPTIONS and TRACE are
// safe methods (RFC 9110): they must not change state, so a transaction
// would take a pooled connection and a BEGIN/COMMIT round trip for nothing,
// and buffering would break downloads and server-sent events. Their
// requests pass through untouched, and outbox.Publish in them fails fast
// with outbox.ErrNoTx. [WithMethods] changes the set, for instance to give
// a GET a consistent snapshot across several queries.
//
// # Client disconnects and deadlines
//
// The transaction is not tied to the client's connection. A client that
// goes away mid-request does not cancel the unit of work: the handler runs
// to completion and the outcome is decided by its status as usual, so the
// data is either all committed or all rolled back, never half. The
// request's context seen by the handler (and by the begin) keeps the request's
// values but is cancelled only by the transaction's own deadline
// ([WithTimeout], default [DefaultTimeout]). A handler that wants to give
// up early on a disconnect can watch [ClientContext].
//
// database/sql rolls a transaction back on its own when the context it was
// begun with ends. If the deadline passes before COMMIT, the middleware
// reports [ErrTxTimeout] (wrapping context.DeadlineExceeded) to the
// ErrorHandler and the log, not a bare sql.ErrTxDone.
//
// An event's lease ([outbox.Config].Lease, 30 s by default) starts when it
// is published. A request that commits more than half a lease after
// publishing still delivers its events, but through the poller instead of
// the hot path, so a slow request never causes a second delivery. Keep
// the timeout below half the lease to keep every request on the hot path.
//
// # When the transaction begins
//
// Not before the handler, but at its first use: the binding's accessor
// (txmw.Tx, gormoutbox.DB, entoutbox.Tx), outbox.Publish, or any
// ExecContext on the context's transaction. So a request holds a pooled
// connection only from its first statement to its end. A handler that
// reads the request body first holds none while a slow client sends it
// (with a pool of 4, four clients sending a byte a second no longer make
// every other request wait and get 503), nor while it calls another
// service before writing; and a request that never uses its transaction
// (a validation error, a cache hit) opens none. The after-commit and
// after-rollback hooks registered before the begin run with the
// transaction's; without a begin they run by the status as if an empty
// transaction had committed or rolled back.
//
// What it gives up:
//
//   - The pool may be found exhausted in the middle of the handler, not
//     before it: the handler runs up to its first use, and anything it did
//     outside the database before (a call to another service, a file
//     written) is not undone by the 503.
//   - The transaction's snapshot starts at the first statement, not at the
//     start of the request. (PostgreSQL and InnoDB take a REPEATABLE READ
//     snapshot at the first statement anyway, so this changes little.)
//   - A binding written for an earlier version, whose accessor asserts its
//     type on txctx.From without txctx.Begun, finds the lazy
//     transaction instead of its own and reports none.
//
// Reading the body first is still not free: a slow client ties up a
// goroutine and its buffers. Bound it at the server, as for any Go HTTP
// service (see "Slow clients").
//
// # Slow clients
//
// The middleware holds no connection while the handler reads the body,
// but the server should still bound how long a client may take and how
// much it may send:
//
//	srv := &http.Server{
//		Handler:           r,
//		ReadHeaderTimeout: 5 * time.Second,  // the request line and headers
//		ReadTimeout:       30 * time.Second, // the whole request, body included
//	}
//
// and in the handler, or in a middleware in front of Transactional:
//
//	r.Body = http.MaxBytesReader(w, r.Body, 1<<20) // 1 MiB; a larger body fails the read
//
// ReadTimeout ends a read of the body that runs past it with an error;
// MaxBytesReader makes a read past the limit fail with *http.MaxBytesError
// (answer 413). Without them a client can send a body for as long and as
// large as it likes.
//
// # Pool exhaustion
//
// The begin waits at most [WithBeginTimeout] (default [DefaultBeginTimeout])
// for a connection. Past that, the ErrorHandler gets an error matching
// [ErrBeginTimeout] and answers 503 with Retry-After by default. The
// handler goes no further than its first use of the transaction: the
// accessors panic with the error (the middleware recovers it), and
// outbox.Publish and ExecContext return it. Whatever the handler then
// writes, the 503 goes out: nothing was written or published.
//
// # Nesting
//
// A request whose context already carries a transaction (an outer
// Transactional, an adapter's middleware, txctx.With) joins it:
// the inner middleware begins nothing, buffers nothing and leaves commit to
// the outer one. One request therefore holds at most one connection, and
// with SetMaxOpenConns(1) nothing deadlocks. txmw.Transact follows the same
// rule.
//
// # Flush, Hijack and streaming
//
// While buffering, Flush (and http.ResponseController's FlushError) does
// nothing, so no byte leaves before the commit; Hijack returns
// [ErrHijack] in every transactional request, because the outcome of a
// hijacked connection cannot be decided from a status. Routes that must
// stream (server-sent events, large exports) opt out of buffering with
// [WithStreaming]: their responses go out as written, Flush works, and the
// transaction is still committed or rolled back by status when the handler
// returns. A streamed 2xx is sent before the commit, so if COMMIT then
// fails the middleware logs it and aborts the connection with
// http.ErrAbortHandler, so that a client reading a chunked body sees a
// truncated response rather than a clean one. Put websocket routes outside
// the middleware or outside its methods.
//
// # Options
//
// [WithOutbox] puts an *outbox.Outbox into each request's context (with
// outbox.NewContext) so that outbox.Publish(r.Context(), env) finds it
// without outbox.SetDefault. The others: [WithIsolation], [WithReadOnly],
// [WithMethods], [WithTimeout], [WithBeginTimeout], [WithCommitPolicy],
// [WithStreaming], [WithErrorHandler], [WithLogger]. Invalid options panic
// in [New], never per request.
//
// # Example
//
//	mw := middleware.New(begin, middleware.WithOutbox(ob), middleware.WithTimeout(10*time.Second))
//	r := chi.NewRouter()
//	r.Use(chimw.Recoverer, mw.Handler)
//	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
//		tx, _ := txctx.From(r.Context())
//		tx.ExecContext(r.Context(), "INSERT INTO orders ...")
//		outbox.Publish(r.Context(), outbox.Envelope{Type: "order.placed", JSON: body})
//		w.WriteHeader(http.StatusCreated) // commit, hooks, then the 201 goes out
//	})
package middleware
