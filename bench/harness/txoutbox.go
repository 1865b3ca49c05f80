package harness

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// OrderPlaced is the event type every txoutbox run publishes.
const OrderPlaced outbox.EventType = "OrderPlaced"

// Txoutbox runs the business transaction through txoutbox.
type Txoutbox struct {
	// HotPath delivers after commit; off, the poller alone delivers.
	HotPath bool
	// Via is how the transaction is opened: ViaTxmw (the request
	// middleware, the handler called in-process) or ViaBeginTx.
	Via Via
	// Experiments on the completion writes, for profiling only (the
	// report's systems leave them zero): DoneDelay holds every MarkDone
	// call that long first, emulating a completer that lingers to fill
	// its batches; SkipDone does not mark events DONE at all.
	DoneDelay time.Duration
	SkipDone  bool
	// DeleteDelivered is sqlstore's Options.DeleteDelivered: delivered
	// events are deleted instead of kept DONE.
	DeleteDelivered bool
	// ArchiveDelivered is sqlstore's Options.ArchiveDelivered: delivered
	// events are moved into the archive table instead of kept DONE.
	ArchiveDelivered bool

	env   *Env
	store *sqlstore.Store
	ob    *outbox.Outbox
	tx    txRunner
	M     Counters
}

// Via is how a txoutbox transaction is opened.
type Via string

const (
	ViaTxmw    Via = "txmw"
	ViaBeginTx Via = "outbox.BeginTx"
	// ViaTransact is txmw.Transact and outbox.Publish, without HTTP.
	ViaTransact Via = "txmw.Transact"
)

// txRunner runs one business transaction for a txoutbox system.
type txRunner func(ctx context.Context, seq int64, payload []byte) error

func (s *Txoutbox) Name() string {
	name := "txoutbox, hot path"
	if !s.HotPath {
		name = "txoutbox, poller only"
	}
	switch {
	case s.DeleteDelivered:
		name += ", DeleteDelivered"
	case s.ArchiveDelivered:
		name += ", ArchiveDelivered"
	case s.SkipDone:
		name += ", no MarkDone (experiment)"
	case s.DoneDelay > 0:
		name += fmt.Sprintf(", MarkDone delayed %v (experiment)", s.DoneDelay)
	}
	return name + " (" + string(s.via()) + ")"
}

func (s *Txoutbox) via() Via {
	if s.Via == "" {
		return DefaultVia
	}
	return s.Via
}

func (s *Txoutbox) Delivers() bool { return true }

// Config returns the outbox configuration of the system.
func (s *Txoutbox) Config() outbox.Config {
	return txoutboxConfig(s.HotPath, &s.M)
}

func txoutboxConfig(hot bool, m *Counters) outbox.Config {
	cfg := outbox.Config{Logger: quietLogger(), Metrics: m}
	if !hot {
		cfg.DisableHotPath = true
		cfg.PollInterval = 10 * time.Millisecond
		cfg.PollMaxInterval = 100 * time.Millisecond
		// SkipRecent spares claims of rows a hot path is about to deliver;
		// with the hot path off it is pure delay.
		cfg.SkipRecent = -1
	}
	return cfg
}

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func newStore(ctx context.Context, db *sqlx.DB, table string) (*sqlstore.Store, error) {
	return newStoreWith(ctx, db, sqlstore.Options{Table: table})
}

func newStoreWith(ctx context.Context, db *sqlx.DB, opts sqlstore.Options) (*sqlstore.Store, error) {
	st, err := sqlstore.New(db, opts)
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

func (s *Txoutbox) Setup(ctx context.Context, env *Env) error {
	s.env = env
	st, err := newStoreWith(ctx, env.DB, sqlstore.Options{Table: env.Prefix + "_ob", DeleteDelivered: s.DeleteDelivered, ArchiveDelivered: s.ArchiveDelivered})
	if err != nil {
		return err
	}
	s.store = st
	store := &countingStore{Store: st, delay: s.DoneDelay, skip: s.SkipDone, m: &s.M}
	ob, err := outbox.New(store, s.Config())
	if err != nil {
		return err
	}
	ob.Handle("bench", func(_ context.Context, ev outbox.Event) error {
		env.Rec.Delivered(seqOf(ev.AggregateID))
		return nil
	}, OrderPlaced)

	s.ob = ob
	if s.tx, err = newTxRunner(s.via(), env, ob); err != nil {
		return err
	}
	return ob.Start(context.WithoutCancel(ctx))
}

// quietPeriod is the longest the poller can sleep between two polls, plus
// SkipRecent and a margin: an event not delivered after that much silence
// is lost.
func (s *Txoutbox) quietPeriod() time.Duration {
	c := s.ob.Config()
	return c.PollMaxInterval + c.PollInterval + max(0, c.SkipRecent) + 2*time.Second
}

func (s *Txoutbox) Tx(ctx context.Context, seq int64, payload []byte) error {
	return s.tx(ctx, seq, payload)
}

func envelope(seq int64, payload []byte) outbox.Envelope {
	return outbox.Envelope{Type: OrderPlaced, AggregateType: "order", AggregateID: strconv.FormatInt(seq, 10), JSON: payload}
}

// beginTxRunner opens the transaction with outbox.BeginTx and publishes
// with PublishTx.
func beginTxRunner(env *Env, ob *outbox.Outbox) txRunner {
	q := insertOrderSQL(env.DB, env.Orders)
	return func(ctx context.Context, seq int64, payload []byte) error {
		tx, err := outbox.BeginTx(ctx, env.DB.DB, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, q, orderArgs(seq)...); err != nil {
			return err
		}
		// Registered first, so it runs first after COMMIT: the commit time
		// is taken before the event can reach the dispatcher.
		tx.AfterCommit(func() { env.Rec.Committed(seq) })
		if _, err := ob.PublishTx(ctx, tx, envelope(seq, payload)); err != nil {
			return err
		}
		return tx.Commit()
	}
}

func (s *Txoutbox) Teardown(ctx context.Context) error {
	var err error
	if s.ob != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = s.ob.Close(cctx)
		cancel()
	}
	if s.store != nil {
		if derr := dropTables(ctx, s.env.DB, storeTables(s.store)...); err == nil {
			err = derr
		}
	}
	return err
}

// Counters is an outbox.Metrics that counts how events travelled.
type Counters struct {
	outbox.NopMetrics
	hot, dropped, cold atomic.Int64
	doneCalls, doneIDs atomic.Int64
	claims             atomic.Int64
	// doneMax is the longest MarkDone (ns); doneSlow counts those over
	// 20 ms (a completion stalled: the diagnosis of the hot queue's
	// overflows at 64 producers).
	doneMax, doneSlow atomic.Int64
}

// SlowDone returns the longest MarkDone and how many took over 20 ms.
func (c *Counters) SlowDone() (longest time.Duration, over20ms int64) {
	return time.Duration(c.doneMax.Load()), c.doneSlow.Load()
}

// Statements returns how many MarkDone statements marked how many events,
// and how many claims ran.
func (c *Counters) Statements() (doneCalls, doneIDs, claims int64) {
	return c.doneCalls.Load(), c.doneIDs.Load(), c.claims.Load()
}

var _ outbox.Metrics = (*Counters)(nil)

func (c *Counters) HotEnqueued()       { c.hot.Add(1) }
func (c *Counters) HotDropped()        { c.dropped.Add(1) }
func (c *Counters) ColdEnqueued(n int) { c.cold.Add(int64(n)) }

// Paths returns how many events went through the hot queue, were dropped
// from a full hot queue, and were queued by the poller.
func (c *Counters) Paths() (hot, dropped, cold int64) {
	return c.hot.Load(), c.dropped.Load(), c.cold.Load()
}

// countingStore counts the engine's completion and claim statements, and
// changes MarkDone for the completion experiments.
type countingStore struct {
	*sqlstore.Store
	delay time.Duration
	skip  bool
	m     *Counters
}

func (e *countingStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	e.m.doneCalls.Add(1)
	e.m.doneIDs.Add(int64(len(ids)))
	if e.skip {
		return len(ids), nil
	}
	time.Sleep(e.delay)
	start := time.Now()
	n, err := e.Store.MarkDone(ctx, owner, ids, registry)
	took := time.Since(start)
	if took > 20*time.Millisecond {
		e.m.doneSlow.Add(1)
	}
	for {
		m := e.m.doneMax.Load()
		if int64(took) <= m || e.m.doneMax.CompareAndSwap(m, int64(took)) {
			break
		}
	}
	return n, err
}

func (e *countingStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	e.m.claims.Add(1)
	return e.Store.Claim(ctx, req)
}

// ConfigSummary describes the configuration in force (defaults filled in)
// of the hot-path or poller-only system, for the report.
func ConfigSummary(db *sqlx.DB, hot bool) string {
	st, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return err.Error()
	}
	ob, err := outbox.New(st, txoutboxConfig(hot, &Counters{}))
	if err != nil {
		return err.Error()
	}
	c := reflect.ValueOf(ob.Config())
	var parts []string
	for i := range c.NumField() {
		f, v := c.Type().Field(i), c.Field(i)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			parts = append(parts, fmt.Sprintf("%s %v", f.Name, time.Duration(v.Int())))
		case v.Kind() == reflect.Int || v.Kind() == reflect.Bool:
			parts = append(parts, fmt.Sprintf("%s %v", f.Name, v.Interface()))
		}
	}
	return strings.Join(parts, ", ")
}
