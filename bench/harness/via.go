package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// DefaultVia is how txoutbox systems open their transaction unless told:
// txmw.Transact, the transaction of txmw without HTTP, so that the
// producer rows compare the same work as the raw baselines (the HTTP rows
// measure the middleware over real HTTP).
const DefaultVia = ViaTransact

func newTxRunner(via Via, env *Env, ob *outbox.Outbox) (txRunner, error) {
	switch via {
	case ViaBeginTx:
		return beginTxRunner(env, ob), nil
	case ViaTxmw:
		return txmwRunner(env, ob), nil
	case ViaTransact:
		return transactRunner(env, ob), nil
	}
	return nil, fmt.Errorf("harness: unknown transaction style %q", via)
}

type seqKey struct{}

// txmwRunner calls a POST /orders handler wrapped in txmw.Transactional
// in-process: the middleware begins the request's transaction, the
// handler inserts the order with txmw.Tx and publishes with the
// package-level outbox.Publish, and a 201 commits.
func txmwRunner(env *Env, ob *outbox.Outbox) txRunner {
	q := insertOrderSQL(env.DB, env.Orders)
	h := txmw.Transactional(env.DB, middleware.WithOutbox(ob))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		seq := ctx.Value(seqKey{}).(int64)
		if _, err := txmw.Tx(ctx).ExecContext(ctx, q, orderArgs(seq)...); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// Registered first, so it runs first after COMMIT: the commit time
		// is taken before the event can reach the dispatcher.
		if err := outbox.AfterCommit(ctx, func() { env.Rec.Committed(seq) }); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := outbox.Publish(ctx, envelope(seq, payloadOf(ctx))); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	return func(ctx context.Context, seq int64, payload []byte) error {
		ctx = context.WithValue(context.WithValue(ctx, seqKey{}, seq), payloadKey{}, payload)
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/orders/"+strconv.FormatInt(seq, 10), nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			return fmt.Errorf("harness: POST /orders: %d %s", rec.Code, rec.Body.String())
		}
		return nil
	}
}

type payloadKey struct{}

func payloadOf(ctx context.Context) []byte { return ctx.Value(payloadKey{}).([]byte) }

// transactRunner runs the transaction with txmw.Transact: the order
// through its *sqlx.Tx, the event with the package-level outbox.Publish
// (the outbox travels in the context, as middleware.WithOutbox puts it).
func transactRunner(env *Env, ob *outbox.Outbox) txRunner {
	q := insertOrderSQL(env.DB, env.Orders)
	return func(ctx context.Context, seq int64, payload []byte) error {
		ctx = outbox.NewContext(ctx, ob)
		return txmw.Transact(ctx, env.DB, func(ctx context.Context, tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(ctx, q, orderArgs(seq)...); err != nil {
				return err
			}
			// Registered first, so it runs first after COMMIT: the commit
			// time is taken before the event can reach the dispatcher.
			if err := outbox.AfterCommit(ctx, func() { env.Rec.Committed(seq) }); err != nil {
				return err
			}
			_, err := outbox.Publish(ctx, envelope(seq, payload))
			return err
		})
	}
}
