// Package txmw runs HTTP requests in database/sql transactions through
// sqlx, so that handlers write business rows and outbox events in one
// unit of work:
//
//	r := chi.NewRouter()
//	r.Use(middleware.Recoverer, txmw.Transactional(db, middleware.WithOutbox(ob)))
//	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
//		tx := txmw.Tx(r.Context()) // the request's *sqlx.Tx
//		if _, err := tx.ExecContext(r.Context(), "INSERT INTO orders (id) VALUES (?)", id); err != nil {
//			http.Error(w, err.Error(), http.StatusInternalServerError) // 500: rolled back
//			return
//		}
//		outbox.Publish(r.Context(), outbox.Envelope{Type: "order.placed", JSON: body})
//		w.WriteHeader(http.StatusCreated) // commit, after-commit hooks, then the 201
//	})
//
// It is the database/sql binding of package middleware, which holds all of
// the HTTP behaviour; read its documentation for the details summarised
// here.
//
// # Guarantees
//
// A 2xx the client sees means the data is committed: the response is
// buffered until COMMIT succeeds. If COMMIT fails, the client gets a 500
// (see [middleware.WithErrorHandler]) and none of the handler's output, and no
// after-commit hook runs. Any other status rolls back and goes out as
// written ([middleware.WithCommitPolicy] changes which statuses commit). A panic rolls
// back, sends nothing and keeps panicking, for a recoverer further out.
// After-commit hooks — the outbox's hand-off to its dispatcher among them
// — run after a successful commit, in registration order, each under its
// own recover, before the response is sent.
//
// # Which requests, and why not GET
//
// POST, PUT, PATCH and DELETE get a transaction. GET, HEAD, OPTIONS and
// TRACE do not: they must not change state, and a transaction would cost a
// connection and a round trip for nothing and would buffer downloads and
// event streams. outbox.Publish in such a request fails with
// outbox.ErrNoTx, and [Tx] panics. Use [middleware.WithMethods] to change the set.
//
// # Client disconnects
//
// The transaction does not end when the client goes away: the handler's
// r.Context() keeps the request's values but is cancelled only by the
// transaction's own deadline ([middleware.WithTimeout], 30 s by default). The unit of
// work finishes and commits or rolls back by status as usual; the client
// simply never reads the answer. A handler that prefers to give up can
// watch middleware.ClientContext(r.Context()). A deadline that passes
// before COMMIT is reported as middleware.ErrTxTimeout, not as
// sql.ErrTxDone.
//
// # When the transaction begins
//
// At its first use, not before the handler: [Tx], [TxFrom], [Transact]
// inside the request, or outbox.Publish. A request holds a pooled
// connection only from its first statement to its end, so a handler that
// reads the body first holds none while a slow client sends it, and a
// request that never touches the database opens no transaction. The
// price: the pool may be found exhausted in the middle of the handler,
// after work outside the database that the 503 does not undo, and the
// snapshot starts at the first statement (see package middleware, "When
// the transaction begins").
//
// # Slow clients
//
// Bound the client at the server all the same: http.Server's
// ReadHeaderTimeout and ReadTimeout limit how long the headers and the
// whole request may take, and http.MaxBytesReader how large the body may
// be:
//
//	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second}
//	...
//	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20)) // 413 on *http.MaxBytesError
//
// # Pool exhaustion
//
// The begin waits at most [middleware.WithBeginTimeout] (5 s by default)
// for a connection, then the request gets 503 with Retry-After: [Tx] and
// [TxFrom] panic with the error (Transactional recovers it and answers),
// outbox.Publish returns it, and whatever the handler writes afterwards
// is replaced by the 503.
//
// # Nesting
//
// A request that already carries a transaction joins it: a second
// Transactional (on a sub-router, say) and [Transact] inside a handler use
// the request's transaction and connection instead of opening another, so
// nothing deadlocks with SetMaxOpenConns(1). Only the outermost commits.
//
// # Streaming
//
// Buffering makes Flush a no-op and Hijack an error (middleware.ErrHijack)
// in transactional requests. Routes that must stream opt out with
// [middleware.WithStreaming]: their bytes go out as written and the transaction is
// still decided by the status, but a streamed 2xx precedes the commit, so
// a failed commit can only abort the connection.
//
// # Outside HTTP
//
// [Transact] runs a function in a transaction with the same hooks, for
// jobs and commands: outbox.Publish(ctx, env) inside it works the same.
package txmw
