package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// A message delivered again (after a crash, a rebalance, a redelivery) is
// applied once: the second Handle is a Duplicate without a handler call,
// and the business row, the outbox event published in the handler and
// the inbox row each exist once.
func TestAppliedOnceOnRedelivery(t *testing.T) {
	eachDB(t, inbox.Config{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		m := inbox.Message{ID: "m-1", Payload: []byte(`{"n":1}`)}
		res, err := e.ib.Handle(ctx, "c", m, e.apply)
		mustResult(t, res, err, inbox.Applied)
		for range 3 {
			res, err = e.ib.Handle(ctx, "c", m, e.apply)
			mustResult(t, res, err, inbox.Duplicate)
		}
		if n := e.calls.Load(); n != 1 {
			t.Errorf("handler called %d times, want 1", n)
		}
		e.wantEffects(t, "m-1", 1, 1, 1)
		// The same id for another consumer is another message.
		res, err = e.ib.Handle(ctx, "other", m, func(ctx context.Context, m inbox.Message) error { return nil })
		mustResult(t, res, err, inbox.Applied)
	})
}

// A duplicate costs one statement, the dedupe INSERT finding the key (a
// primary-key probe), calls no handler and writes nothing: in its
// transaction the database records no change (PostgreSQL assigns no
// transaction id, InnoDB writes no undo entry, SQLite counts no changed
// row), no business row, outbox event or inbox row appears, and the
// inbox row keeps its time and attempts. A new message, measured the same
// way, shows that the probes see a write.
func TestDuplicateWritesNothing(t *testing.T) {
	eachDB(t, inbox.Config{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		probe := &writeProbe{name: e.name}
		cfg := inbox.Config{Table: strings.Trim(e.store.Table(), "`\""), Begin: probe.begin(e.db.DB)}
		cfg.Dialect, _ = inbox.DialectNamed(e.name)
		ib, err := inbox.New(e.db.DB, cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := inbox.Message{ID: "d-1"}
		res, err := ib.Handle(ctx, "c", m, func(ctx context.Context, m inbox.Message) error {
			_, err := probe.tx.ExecContext(ctx, e.db.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID)
			return err
		})
		mustResult(t, res, err, inbox.Applied)
		if probe.stmts != 1 || probe.err != nil || !probe.wrote {
			t.Fatalf("new message: %d statements before the handler, wrote %v (probe error %v); want 1, true", probe.stmts, probe.wrote, probe.err)
		}
		var before, after struct {
			At       string `db:"at"`
			Attempts int    `db:"attempts"`
		}
		q := "SELECT CAST(received_at AS CHAR(40)) AS at, attempts FROM " + e.store.InboxTable() + " WHERE message_id = 'd-1'"
		if e.name != "mysql" {
			q = strings.Replace(q, "CHAR(40)", "TEXT", 1)
		}
		if err := e.db.Get(&before, q); err != nil {
			t.Fatal(err)
		}
		probe.stmts, probe.wrote = 0, false
		res, err = ib.Handle(ctx, "c", m, func(context.Context, inbox.Message) error {
			t.Error("handler called for a duplicate")
			return nil
		})
		mustResult(t, res, err, inbox.Duplicate)
		if probe.err != nil {
			t.Fatal(probe.err)
		}
		if probe.stmts != 1 || probe.wrote {
			t.Errorf("duplicate: %d statements, wrote %v; want 1 statement (the dedupe INSERT) and no write", probe.stmts, probe.wrote)
		}
		if err := e.db.Get(&after, q); err != nil {
			t.Fatal(err)
		}
		if before != after {
			t.Errorf("inbox row changed by a duplicate: %+v -> %+v", before, after)
		}
		e.wantEffects(t, "d-1", 1, 0, 1)
	})
}

// writeProbe is a Config.Begin whose transactions count the statements
// run on them and, after the first one (the inbox's dedupe INSERT), ask
// the database whether the transaction has written anything.
type writeProbe struct {
	name  string
	tx    *sql.Tx
	stmts int
	wrote bool
	err   error
	base  int64 // SQLite: total_changes() at the first statement
}

type probedTx struct {
	*outbox.Tx
	p *writeProbe
}

func (p *writeProbe) begin(db *sql.DB) middleware.BeginFunc {
	return func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		tx, err := outbox.BeginTx(ctx, db, opts)
		if err != nil {
			return nil, err
		}
		p.tx = tx.Tx
		return probedTx{Tx: tx, p: p}, nil
	}
}

func (u probedTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	p := u.p
	p.stmts++
	if p.stmts == 1 && p.name == "sqlite" {
		p.err = p.tx.QueryRowContext(ctx, "SELECT total_changes()").Scan(&p.base)
	}
	res, err := u.Tx.ExecContext(ctx, q, args...)
	if err == nil && p.stmts == 1 && p.err == nil {
		p.wrote, p.err = p.written(ctx)
	}
	return res, err
}

// written reports whether the transaction has changed anything.
func (p *writeProbe) written(ctx context.Context) (bool, error) {
	switch p.name {
	case "postgres":
		// A transaction gets an id at its first write (or row lock).
		var assigned bool
		err := p.tx.QueryRowContext(ctx, "SELECT txid_current_if_assigned() IS NOT NULL").Scan(&assigned)
		return assigned, err
	case "sqlite":
		var n int64
		err := p.tx.QueryRowContext(ctx, "SELECT total_changes()").Scan(&n)
		return n != p.base, err
	}
	// InnoDB lists an undo entry for each row a transaction changed
	// (information_schema.INNODB_TRX is a cache refreshed at most every
	// 100 ms; this is not).
	var id int64
	if err := p.tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		return false, err
	}
	var typ, name, status string
	if err := p.tx.QueryRowContext(ctx, "SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
		return false, err
	}
	for _, trx := range strings.Split(status, "---TRANSACTION") {
		if strings.Contains(trx, fmt.Sprintf(" thread id %d,", id)) {
			return strings.Contains(trx, "undo log entries"), nil
		}
	}
	return false, fmt.Errorf("no transaction of connection %d in SHOW ENGINE INNODB STATUS:\n%s", id, status)
}

// Deliveries of one message that run at the same time apply it once: the
// dedupe insert of the second waits for the first's transaction.
func TestConcurrentDeliveriesApplyOnce(t *testing.T) {
	eachDB(t, inbox.Config{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		const n = 8
		results := make([]inbox.Result, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i], errs[i] = e.ib.Handle(ctx, "c", inbox.Message{ID: "same"}, e.apply)
			})
		}
		wg.Wait()
		applied := 0
		for i, r := range results {
			switch {
			case r == inbox.Applied:
				applied++
			case r == inbox.Failed:
				// a deadlock between waiting inserts (MySQL) is a
				// Failed the broker redelivers; not counted as an attempt
				t.Logf("delivery %d: %v", i, errs[i])
			case r != inbox.Duplicate:
				t.Errorf("delivery %d: %v %v", i, r, errs[i])
			}
		}
		if applied != 1 {
			t.Errorf("%d deliveries applied, want 1 (%v)", applied, results)
		}
		e.wantEffects(t, "same", 1, 1, 1)
	})
}

// A handler error rolls back its business row, its outbox event and the
// inbox row; the broker's redelivery then applies the message once.
func TestHandlerErrorRollsBackThenRetryAppliesOnce(t *testing.T) {
	eachDB(t, inbox.Config{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		m := inbox.Message{ID: "r-1"}
		res, err := e.ib.Handle(ctx, "c", m, e.failing(errBoom))
		if res != inbox.Failed || !errors.Is(err, errBoom) || res.Settled() {
			t.Fatalf("failing handler: %v %v, want Failed with its error", res, err)
		}
		e.wantEffects(t, "r-1", 0, 0, 0)
		if n := e.count(t, "SELECT attempts FROM "+e.store.InboxFailuresTable()+" WHERE message_id = 'r-1'"); n != 1 {
			t.Errorf("failed attempts recorded: %d, want 1", n)
		}
		res, err = e.ib.Handle(ctx, "c", m, e.apply)
		mustResult(t, res, err, inbox.Applied)
		res, err = e.ib.Handle(ctx, "c", m, e.apply)
		mustResult(t, res, err, inbox.Duplicate)
		e.wantEffects(t, "r-1", 1, 1, 1)
	})
}

// A handler error after the caller's context ended (a shutdown) is not
// counted against the message.
func TestShutdownErrorNotCounted(t *testing.T) {
	eachDB(t, inbox.Config{MaxAttempts: 1}, func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(context.Background())
		res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: "s-1"}, func(ctx context.Context, m inbox.Message) error {
			cancel()
			return ctx.Err()
		})
		if res != inbox.Failed || !errors.Is(err, context.Canceled) {
			t.Fatalf("%v %v, want Failed, context.Canceled", res, err)
		}
		if n := e.count(t, "SELECT COUNT(*) FROM "+e.store.InboxFailuresTable()); n != 0 {
			t.Errorf("%d failure rows after a shutdown, want 0", n)
		}
		e.wantEffects(t, "s-1", 0, 0, 0)
	})
}

// A handler that panics is contained: Handle returns Failed with a
// *PanicError, nothing is written, and the next message is handled.
func TestHandlerPanicContained(t *testing.T) {
	eachDB(t, inbox.Config{}, func(t *testing.T, e *env) {
		ctx := context.Background()
		res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: "p-1"}, func(ctx context.Context, m inbox.Message) error {
			if err := e.apply(ctx, m); err != nil {
				return err
			}
			panic("nil map")
		})
		var pe *inbox.PanicError
		if res != inbox.Failed || !errors.As(err, &pe) || pe.Value != "nil map" {
			t.Fatalf("%v %v, want Failed with a *PanicError", res, err)
		}
		e.wantEffects(t, "p-1", 0, 0, 0)
		res, err = e.ib.Handle(ctx, "c", inbox.Message{ID: "p-1"}, e.apply)
		mustResult(t, res, err, inbox.Applied)
		e.wantEffects(t, "p-1", 1, 1, 1)
	})
}

// The handler can use a txmw (sqlx) transaction through Config.Begin;
// outbox.Publish joins it as before.
func TestBeginWithTxmw(t *testing.T) {
	for _, name := range []string{"sqlite", "mysql", "postgres"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, name, inbox.Config{})
			cfg := inbox.Config{Dialect: inbox.MySQL, Table: strings.Trim(e.store.Table(), "`\""), Begin: txmw.Begin(e.db)}
			cfg.Dialect, _ = inbox.DialectNamed(name)
			ib, err := inbox.New(e.db.DB, cfg)
			if err != nil {
				t.Fatal(err)
			}
			h := func(ctx context.Context, m inbox.Message) error {
				var tx *sqlx.Tx = txmw.Tx(ctx)
				if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+e.items+" (id) VALUES (?)"), m.ID); err != nil {
					return err
				}
				_, err := outbox.Publish(outbox.NewContext(ctx, e.ob), outbox.Envelope{Type: "item.applied", AggregateID: m.ID, JSON: []byte(`{}`)})
				return err
			}
			res, err := ib.Handle(context.Background(), "c", inbox.Message{ID: "x"}, h)
			mustResult(t, res, err, inbox.Applied)
			res, err = ib.Handle(context.Background(), "c", inbox.Message{ID: "x"}, h)
			mustResult(t, res, err, inbox.Duplicate)
			e.wantEffects(t, "x", 1, 1, 1)
		})
	}
}
