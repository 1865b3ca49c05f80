package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// The inbox rows (issue 36): consumption through the inbox's consumers
// against a hand-written consume → BEGIN → INSERT dedupe row → effect →
// COMMIT → ack loop with the same broker client, and the cost of a
// duplicate.

// Systems of the inbox consumption rows.
const (
	InboxRawName      = "hand-written loop"
	InboxConsumerName = "inbox consumer"
)

// Systems of the duplicate rows.
const (
	DupLookupName = "BEGIN; SELECT the key; ROLLBACK (hand-written)"
	DupFreshName  = "inbox Handle, new message"
	DupDupName    = "inbox Handle, duplicate"
)

// InboxOptions configures RunInbox.
type InboxOptions struct {
	// Brokers of the consumption rows: "nats", "kafka" (kfake).
	Brokers []string
	Addrs   BrokerAddrs
	// N is the messages of one consumption measurement; default 5,000.
	N int
	// Concurrency is the messages handled at once (NATS) or partitions
	// handled at once, with one partition per worker (Kafka); default 4,
	// the consumers' default.
	Concurrency int
	// Repeats of each cell; the systems alternate their order.
	Repeats int
	// Dups is the Handle calls of one duplicate measurement; default 2,000.
	Dups int
	Log  func(format string, args ...any)
}

func (o *InboxOptions) defaults() {
	if len(o.Brokers) == 0 {
		o.Brokers = []string{"nats", "kafka"}
	}
	o.Addrs = o.Addrs.withDefaults()
	if o.N <= 0 {
		o.N = 5000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.Repeats <= 0 {
		o.Repeats = 3
	}
	if o.Dups <= 0 {
		o.Dups = 2000
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
}

// InboxCell is one consumption measurement.
type InboxCell struct {
	DB, Broker, System string
	Repeat             int
	N, Concurrency     int
	// Elapsed is from the first message's handling to the N-th commit
	// (the group join and the stream setup are outside it).
	Elapsed time.Duration
	MsgPS   float64
}

// DupCell is one measurement of the duplicate rows: Dups sequential
// operations on one connection at a time.
type DupCell struct {
	DB, System string
	Repeat     int
	N          int
	PerOp      time.Duration
	// For the inbox rows: statements run in the handler's transaction
	// per Handle, handler calls, and rows added to the inbox and business
	// tables over the whole measurement.
	Statements   float64
	HandlerCalls int64
	RowsWritten  int64
}

// InboxReport is what RunInbox measured, on every database.
type InboxReport struct {
	Header string `json:",omitempty"`
	Cells  []InboxCell
	Dups   []DupCell
	Opts   InboxOptions `json:"-"`
}

// RunInbox measures the inbox rows on one database and appends them to rep.
func RunInbox(ctx context.Context, d *Dialect, db *sqlx.DB, rep *InboxReport, opts InboxOptions) error {
	opts.defaults()
	rep.Opts = opts
	brokers := map[string]inboxBroker{}
	defer func() {
		for _, b := range brokers {
			b.close()
		}
	}()
	for _, name := range opts.Brokers {
		b, err := openInboxBroker(name, opts.Addrs)
		if err != nil {
			return fmt.Errorf("inbox rows: broker %s: %w", name, err)
		}
		brokers[name] = b
	}
	for r := range opts.Repeats {
		for _, name := range opts.Brokers {
			systems := []string{InboxRawName, InboxConsumerName}
			if r%2 == 1 {
				systems[0], systems[1] = systems[1], systems[0]
			}
			for _, sys := range systems {
				c, err := runInboxCell(ctx, d, db, brokers[name], sys, opts)
				if err != nil {
					return fmt.Errorf("inbox rows: %s, %s, %s: %w", d.Name, name, sys, err)
				}
				c.Repeat = r
				opts.Log("%s rep %d, %s, %s: %d messages in %v: %.0f msg/s", d.Name, r+1, brokers[name].name(), sys, c.N, c.Elapsed.Round(time.Millisecond), c.MsgPS)
				rep.Cells = append(rep.Cells, c)
			}
		}
		cells, err := runDupCells(ctx, d, db, r, opts)
		if err != nil {
			return fmt.Errorf("inbox rows: %s, duplicates: %w", d.Name, err)
		}
		for _, c := range cells {
			opts.Log("%s rep %d, %s: %v per call, %.2f statements, %d handler calls, %d rows written", d.Name, r+1, c.System, c.PerOp, c.Statements, c.HandlerCalls, c.RowsWritten)
		}
		rep.Dups = append(rep.Dups, cells...)
	}
	return nil
}

// inboxTables are one cell's tables: the business table (the effect),
// the hand-written loop's dedupe table, and a migrated outbox store whose
// inbox tables the inbox uses.
type inboxTables struct {
	d      *Dialect
	db     *sqlx.DB
	prefix string
	items  string // quoted
	dedupe string // quoted
	store  string // sqlstore table name (unquoted)
	drop   []string
	// The hand-written loop's statements.
	claim, effect, lookup string
}

func newInboxTables(ctx context.Context, d *Dialect, db *sqlx.DB, prefix string) (*inboxTables, error) {
	t := &inboxTables{d: d, db: db, prefix: prefix, items: d.Quote(prefix + "_items"), dedupe: d.Quote(prefix + "_dedupe"), store: prefix + "_ob"}
	ddl := []string{"CREATE TABLE " + t.items + " (id VARCHAR(255) NOT NULL PRIMARY KEY, body TEXT NOT NULL)"}
	if d == MariaDB {
		ddl = append(ddl, "CREATE TABLE "+t.dedupe+` (consumer VARBINARY(100) NOT NULL, message_id VARBINARY(255) NOT NULL,
  received_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, message_id), KEY `+prefix+`_dedupe_age (received_at)) ENGINE=InnoDB`)
		t.claim = "INSERT IGNORE INTO " + t.dedupe + " (consumer, message_id, received_at) VALUES (?, ?, " + d.Now + ")"
	} else {
		ddl = append(ddl, "CREATE TABLE "+t.dedupe+` (consumer VARCHAR(100) NOT NULL, message_id VARCHAR(255) NOT NULL,
  received_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, message_id))`,
			"CREATE INDEX "+prefix+"_dedupe_age ON "+t.dedupe+" (received_at)")
		t.claim = "INSERT INTO " + t.dedupe + " (consumer, message_id, received_at) VALUES ($1, $2, " + d.Now + ") ON CONFLICT (consumer, message_id) DO NOTHING"
	}
	t.effect = db.Rebind("INSERT INTO " + t.items + " (id, body) VALUES (?, ?)")
	t.lookup = db.Rebind("SELECT 1 FROM " + t.dedupe + " WHERE consumer = ? AND message_id = ?")
	t.drop = []string{t.items, t.dedupe}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.close(ctx)
			return nil, err
		}
	}
	st, err := newStore(ctx, db, t.store)
	if err != nil {
		t.close(ctx)
		return nil, err
	}
	t.drop = append(t.drop, storeTables(st)...)
	return t, nil
}

func (t *inboxTables) close(ctx context.Context) { _ = dropTables(ctx, t.db, t.drop...) }

func (t *inboxTables) inbox(cfg inbox.Config) (*inbox.Inbox, error) {
	cfg.Dialect = inbox.MySQL
	if t.d == PostgreSQL {
		cfg.Dialect = inbox.Postgres
	}
	cfg.Table = t.store
	return inbox.New(t.db.DB, cfg)
}

// apply is the effect in the inbox's transaction.
func (t *inboxTables) apply(ctx context.Context, m inbox.Message) error {
	_, err := inbox.Tx(ctx).ExecContext(ctx, t.effect, m.ID, m.Payload)
	return err
}

// handRolled is the hand-written loop's body for one message: BEGIN,
// INSERT the dedupe row (skipped if it exists), the effect, COMMIT. It
// reports whether the message was applied (false: a duplicate).
func (t *inboxTables) handRolled(ctx context.Context, consumer, id string, payload []byte) (bool, error) {
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, t.claim, consumer, id)
	if err != nil {
		return false, errors.Join(err, tx.Rollback())
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, errors.Join(err, tx.Rollback())
	}
	if _, err := tx.ExecContext(ctx, t.effect, id, payload); err != nil {
		return false, errors.Join(err, tx.Rollback())
	}
	return true, tx.Commit()
}

func (t *inboxTables) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := t.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n)
	return n, err
}

// meter records the first handling and the N-th commit of a cell.
type meter struct {
	n       int64
	first   atomic.Int64 // unix nanos
	applied atomic.Int64
	last    atomic.Int64
	done    chan struct{}
	once    sync.Once
	err     error
}

func newMeter(n int) *meter { return &meter{n: int64(n), done: make(chan struct{})} }

func (m *meter) start() { m.first.CompareAndSwap(0, time.Now().UnixNano()) }

func (m *meter) committed() {
	if m.applied.Add(1) == m.n {
		m.once.Do(func() { m.last.Store(time.Now().UnixNano()); close(m.done) })
	}
}

func (m *meter) fail(err error) {
	m.once.Do(func() { m.err = err; close(m.done) })
}

func (m *meter) wait(ctx context.Context) (time.Duration, error) {
	t := time.NewTimer(5 * time.Minute)
	defer t.Stop()
	select {
	case <-m.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.C:
		return 0, fmt.Errorf("%d of %d messages applied after 5 minutes", m.applied.Load(), m.n)
	}
	if m.err != nil {
		return 0, m.err
	}
	return time.Duration(m.last.Load() - m.first.Load()), nil
}

func runInboxCell(ctx context.Context, d *Dialect, db *sqlx.DB, b inboxBroker, system string, opts InboxOptions) (InboxCell, error) {
	c := InboxCell{DB: d.Name, Broker: b.name(), System: system, N: opts.N, Concurrency: opts.Concurrency}
	prefix := UniquePrefix("ib")
	t, err := newInboxTables(ctx, d, db, prefix)
	if err != nil {
		return c, err
	}
	defer t.close(ctx)
	if err := b.prepare(ctx, prefix, opts.N, opts.Concurrency); err != nil {
		return c, err
	}
	defer b.remove(prefix)
	m := newMeter(opts.N)
	var stop func() error
	if system == InboxRawName {
		stop, err = b.handRolled(ctx, prefix, t, m, opts.Concurrency)
	} else {
		var ib *inbox.Inbox
		ib, err = t.inbox(inbox.Config{Observe: func(o inbox.Observation) {
			if o.Result == inbox.Applied {
				m.committed()
			} else if o.Result != inbox.Duplicate {
				m.fail(fmt.Errorf("message %s: %v: %v", o.MessageID, o.Result, o.Err))
			}
		}})
		if err == nil {
			h := func(ctx context.Context, msg inbox.Message) error { m.start(); return t.apply(ctx, msg) }
			stop, err = b.consumer(ctx, prefix, ib, h, opts.Concurrency)
		}
	}
	if err != nil {
		return c, err
	}
	c.Elapsed, err = m.wait(ctx)
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return c, err
	}
	c.MsgPS = float64(opts.N) / c.Elapsed.Seconds()
	if n, err := t.count(ctx, t.items); err != nil || n != int64(opts.N) {
		return c, fmt.Errorf("business rows %d (%v), want %d", n, err, opts.N)
	}
	return c, nil
}

// inboxBroker is a broker of the consumption rows.
type inboxBroker interface {
	name() string
	// prepare creates the destination dest holding n messages, each with
	// a txoutbox-id header, spread over parts partitions (Kafka).
	prepare(ctx context.Context, dest string, n, parts int) error
	// handRolled starts the hand-written loop on dest; consumer starts
	// the inbox's consumer. The returned function stops it.
	handRolled(ctx context.Context, dest string, t *inboxTables, m *meter, conc int) (func() error, error)
	consumer(ctx context.Context, dest string, ib *inbox.Inbox, h inbox.Handler, conc int) (func() error, error)
	remove(dest string)
	close()
}

func openInboxBroker(name string, a BrokerAddrs) (inboxBroker, error) {
	switch name {
	case "nats":
		nc, err := nats.Connect(a.NATS)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return &natsInbox{nc: nc, js: js}, nil
	case "kafka":
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, err
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			c.Close()
			return nil, err
		}
		return &kafkaInbox{c: c, cl: cl, adm: kadm.NewClient(cl)}, nil
	}
	return nil, fmt.Errorf("harness: the inbox rows take nats or kafka, not %q", name)
}

func messageID(dest string, i int) string { return fmt.Sprintf("%s-%d", dest, i) }

// --- NATS JetStream

type natsInbox struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func (b *natsInbox) name() string { return "NATS JetStream" }

func (b *natsInbox) prepare(ctx context.Context, dest string, n, _ int) error {
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: dest, Subjects: []string{dest + ".>"}}); err != nil {
		return err
	}
	for i := range n {
		msg := &nats.Msg{Subject: dest + ".OrderPlaced", Data: Payload(int64(i)), Header: nats.Header{}}
		msg.Header.Set(meta.ID, messageID(dest, i))
		if _, err := b.js.PublishMsgAsync(msg); err != nil {
			return err
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(brokerTimeout):
		return errors.New("nats: prefill not acknowledged")
	}
	_, err := b.js.CreateOrUpdateConsumer(ctx, dest, jetstream.ConsumerConfig{Durable: dest, AckPolicy: jetstream.AckExplicitPolicy})
	return err
}

func (b *natsInbox) handRolled(ctx context.Context, dest string, t *inboxTables, m *meter, conc int) (func() error, error) {
	cons, err := b.js.Consumer(ctx, dest, dest)
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(conc))
	if err != nil {
		return nil, err
	}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(work)
		for {
			msg, err := it.Next()
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			if err == nil {
				work <- msg
			}
		}
	})
	for range conc {
		wg.Go(func() {
			for msg := range work {
				m.start()
				applied, err := t.handRolled(ctx, "bench", msg.Headers().Get(meta.ID), msg.Data())
				if err != nil {
					_ = msg.Nak()
					m.fail(err)
					continue
				}
				_ = msg.Ack()
				if applied {
					m.committed()
				}
			}
		})
	}
	return func() error { it.Stop(); wg.Wait(); return nil }, nil
}

func (b *natsInbox) consumer(ctx context.Context, dest string, ib *inbox.Inbox, h inbox.Handler, conc int) (func() error, error) {
	cons, err := b.js.Consumer(ctx, dest, dest)
	if err != nil {
		return nil, err
	}
	c, err := natsoutbox.NewConsumer(natsoutbox.ConsumerConfig{Inbox: ib, Name: "bench", Consumer: cons, Handler: h, Concurrency: conc, Logger: quietLogger()})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return func() error { return c.Close(context.WithoutCancel(ctx)) }, nil
}

func (b *natsInbox) remove(dest string) {
	ctx, cancel := context.WithTimeout(context.Background(), brokerTimeout)
	defer cancel()
	_ = b.js.DeleteStream(ctx, dest)
}

func (b *natsInbox) close() { b.nc.Close() }

// --- Kafka (kfake)

type kafkaInbox struct {
	c   *kfake.Cluster
	cl  *kgo.Client // producer, manual partitions
	adm *kadm.Client
}

func (b *kafkaInbox) name() string { return "Kafka (kfake, in-process)" }

func (b *kafkaInbox) prepare(ctx context.Context, dest string, n, parts int) error {
	resp, err := b.adm.CreateTopic(ctx, int32(parts), 1, nil, dest)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return err
	}
	const chunk = 1000
	for from := 0; from < n; from += chunk {
		recs := make([]*kgo.Record, 0, chunk)
		for i := from; i < min(from+chunk, n); i++ {
			recs = append(recs, &kgo.Record{Topic: dest, Partition: int32(i % parts), Value: Payload(int64(i)),
				Headers: []kgo.RecordHeader{{Key: meta.ID, Value: []byte(messageID(dest, i))}}})
		}
		if err := b.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return err
		}
	}
	return nil
}

// group returns a consumer-group client on dest as the inbox's Kafka
// consumer requires it (and the hand-written loop uses the same).
func (b *kafkaInbox) group(dest string) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(b.c.ListenAddrs()...), kgo.ConsumerGroup(dest), kgo.ConsumeTopics(dest),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
}

// handRolled is the loop of kafkaoutbox.Consumer written by hand: poll up
// to 100 records, handle the partitions in parallel (conc at once) and
// each partition's records in order, commit the offsets, allow a
// rebalance.
func (b *kafkaInbox) handRolled(ctx context.Context, dest string, t *inboxTables, m *meter, conc int) (func() error, error) {
	cl, err := b.group(dest)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for pctx.Err() == nil {
			fetches := cl.PollRecords(pctx, 100)
			if pctx.Err() != nil || fetches.IsClientClosed() {
				cl.AllowRebalance()
				return
			}
			if settled := b.handleFetches(pctx, fetches, t, m, conc); len(settled) > 0 {
				if err := cl.CommitRecords(context.WithoutCancel(pctx), settled...); err != nil {
					m.fail(err)
				}
			}
			cl.AllowRebalance()
		}
	})
	return func() error { cancel(); wg.Wait(); cl.Close(); return nil }, nil
}

func (b *kafkaInbox) handleFetches(ctx context.Context, fetches kgo.Fetches, t *inboxTables, m *meter, conc int) []*kgo.Record {
	var (
		mu      sync.Mutex
		settled []*kgo.Record
		wg      sync.WaitGroup
		sem     = make(chan struct{}, conc)
	)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var last *kgo.Record
			for _, r := range p.Records {
				m.start()
				id := ""
				for _, h := range r.Headers {
					if h.Key == meta.ID {
						id = string(h.Value)
						break
					}
				}
				applied, err := t.handRolled(ctx, "bench", id, r.Value)
				if err != nil {
					m.fail(err)
					break
				}
				if applied {
					m.committed()
				}
				last = r
			}
			if last != nil {
				mu.Lock()
				settled = append(settled, last)
				mu.Unlock()
			}
		})
	})
	wg.Wait()
	return settled
}

func (b *kafkaInbox) consumer(ctx context.Context, dest string, ib *inbox.Inbox, h inbox.Handler, conc int) (func() error, error) {
	cl, err := b.group(dest)
	if err != nil {
		return nil, err
	}
	c, err := kafkaoutbox.NewConsumer(kafkaoutbox.ConsumerConfig{Inbox: ib, Name: "bench", Client: cl, Handler: h, Concurrency: conc, Logger: quietLogger()})
	if err == nil {
		err = c.Start(ctx)
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	return func() error { err := c.Close(context.WithoutCancel(ctx)); cl.Close(); return err }, nil
}

func (b *kafkaInbox) remove(dest string) {
	ctx, cancel := context.WithTimeout(context.Background(), brokerTimeout)
	defer cancel()
	_, _ = b.adm.DeleteTopics(ctx, dest)
}

func (b *kafkaInbox) close() { b.cl.Close(); b.c.Close() }

// --- duplicates

// countingUnit counts the statements run in a handler's transaction.
type countingUnit struct {
	*outbox.Tx
	n *atomic.Int64
}

func (u countingUnit) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	u.n.Add(1)
	return u.Tx.ExecContext(ctx, q, args...)
}

// dupChunk is the number of messages of one slice of the duplicate
// cells: each system runs one slice in turn, so that the three see the
// same load.
const dupChunk = 100

// runDupCells measures, on fresh tables, Dups sequential calls of each:
// the hand-written floor of a duplicate (one transaction with one lookup
// of the key), Handle of new messages (dedupe row + one INSERT), and
// Handle of the same messages again (all duplicates). They take turns by
// slices of dupChunk messages, in an order that rotates (a slice's
// duplicates always after its new messages).
func runDupCells(ctx context.Context, d *Dialect, db *sqlx.DB, repeat int, opts InboxOptions) ([]DupCell, error) {
	t, err := newInboxTables(ctx, d, db, UniquePrefix("dup"))
	if err != nil {
		return nil, err
	}
	defer t.close(ctx)
	r := &dupRun{t: t}
	r.ib, err = t.inbox(inbox.Config{Begin: func(ctx context.Context, opts *sql.TxOptions) (middleware.Unit, error) {
		tx, err := outbox.BeginTx(ctx, t.db.DB, opts)
		if err != nil {
			return nil, err
		}
		return countingUnit{Tx: tx, n: &r.stmts}, nil
	}})
	if err != nil {
		return nil, err
	}
	ids := make([]string, opts.Dups)
	for i := range ids {
		ids[i] = messageID(t.prefix, i)
		// The hand-written dedupe table holds the same keys.
		if _, err := t.db.ExecContext(ctx, t.claim, "bench", ids[i]); err != nil {
			return nil, err
		}
	}
	cells := []*DupCell{{System: DupLookupName, Statements: 1}, {System: DupFreshName}, {System: DupDupName}}
	orders := [][]int{{0, 1, 2}, {1, 2, 0}, {1, 0, 2}}
	for from := 0; from < len(ids); from += dupChunk {
		chunk := ids[from:min(from+dupChunk, len(ids))]
		for _, k := range orders[(from/dupChunk+repeat)%len(orders)] {
			if err := r.run(ctx, cells[k], chunk); err != nil {
				return nil, err
			}
		}
	}
	out := make([]DupCell, len(cells))
	for i, c := range cells {
		c.DB, c.Repeat, c.N = d.Name, repeat, len(ids)
		c.PerOp /= time.Duration(len(ids))
		if c.System != DupLookupName {
			c.Statements /= float64(len(ids))
		}
		out[i] = *c
	}
	return out, nil
}

// dupRun is the state of one run of the duplicate cells.
type dupRun struct {
	t     *inboxTables
	ib    *inbox.Inbox
	stmts atomic.Int64 // in the inbox's transactions
	calls atomic.Int64 // of the handler
}

func (r *dupRun) apply(ctx context.Context, m inbox.Message) error {
	r.calls.Add(1)
	tx, _ := txctx.From(ctx)
	_, err := tx.ExecContext(ctx, r.t.effect, m.ID, m.Payload)
	return err
}

// rows is the rows of the inbox and business tables.
func (r *dupRun) rows(ctx context.Context) (int64, error) {
	a, err := r.t.count(ctx, r.t.items)
	if err != nil {
		return 0, err
	}
	b, err := r.t.count(ctx, r.t.d.Quote(r.t.store+"_inbox"))
	return a + b, err
}

// run runs c's system on ids, adding the time (in PerOp, summed), the
// statements, handler calls and rows written to c.
func (r *dupRun) run(ctx context.Context, c *DupCell, ids []string) error {
	before, err := r.rows(ctx)
	if err != nil {
		return err
	}
	s0, c0 := r.stmts.Load(), r.calls.Load()
	start := time.Now()
	if c.System == DupLookupName {
		err = r.t.lookups(ctx, ids)
	} else {
		err = r.handle(ctx, c.System, ids)
	}
	if err != nil {
		return err
	}
	c.PerOp += time.Since(start)
	after, err := r.rows(ctx)
	if err != nil {
		return err
	}
	if c.System != DupLookupName {
		c.Statements += float64(r.stmts.Load() - s0)
	}
	c.HandlerCalls += r.calls.Load() - c0
	c.RowsWritten += after - before
	return nil
}

func (r *dupRun) handle(ctx context.Context, system string, ids []string) error {
	want := inbox.Applied
	if system == DupDupName {
		want = inbox.Duplicate
	}
	for i, id := range ids {
		res, err := r.ib.Handle(ctx, "bench", inbox.Message{ID: id, Payload: Payload(int64(i))}, r.apply)
		if res != want {
			return fmt.Errorf("message %s: %v (%v), want %v", id, res, err, want)
		}
	}
	return nil
}

// lookups runs the hand-written floor of a duplicate for each id.
func (t *inboxTables) lookups(ctx context.Context, ids []string) error {
	for _, id := range ids {
		tx, err := t.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		var one int
		err = tx.QueryRowContext(ctx, t.lookup, "bench", id).Scan(&one)
		if rerr := tx.Rollback(); err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// --- report

// Targets are the inbox rows' targets.
func (r *InboxReport) Targets() []Target {
	var ts []Target
	for _, db := range r.dbs() {
		for _, br := range r.brokers() {
			rs := r.ratios(db, br)
			if len(rs) == 0 {
				continue
			}
			s := statOf(rs)
			ts = append(ts, target(fmt.Sprintf("%s: inbox consumption msg/s ÷ hand-written consume → BEGIN → dedupe INSERT → effect → COMMIT → ack loop, %s, %d at once", db, br, r.Opts.Concurrency),
				"≥ 0.80", s.f(ratio), s.med >= 0.8))
		}
		dup, look := r.dupStat(db, DupDupName), r.dupStat(db, DupLookupName)
		if len(dup) == 0 {
			continue
		}
		var calls, written int64
		var stmts float64
		for _, c := range r.Dups {
			if c.DB == db && c.System == DupDupName {
				calls += c.HandlerCalls
				written += c.RowsWritten
				stmts = max(stmts, c.Statements)
			}
		}
		var rs []float64
		for i := range min(len(dup), len(look)) {
			rs = append(rs, dup[i]/look[i])
		}
		s := statOf(rs)
		ts = append(ts, target(db+": a duplicate costs at most one indexed lookup, with no handler call and no write",
			"1 statement, 0 calls, 0 rows; time ≈ BEGIN + key lookup + ROLLBACK",
			fmt.Sprintf("%.0f statement(s), %d handler calls, %d rows written; time ÷ hand-written lookup transaction %s", stmts, calls, written, s.f(ratio)),
			stmts <= 1 && calls == 0 && written == 0))
	}
	return ts
}

func (r *InboxReport) dbs() []string {
	var out []string
	for _, c := range r.Cells {
		if !contains(out, c.DB) {
			out = append(out, c.DB)
		}
	}
	for _, c := range r.Dups {
		if !contains(out, c.DB) {
			out = append(out, c.DB)
		}
	}
	return out
}

func (r *InboxReport) brokers() []string {
	var out []string
	for _, c := range r.Cells {
		if !contains(out, c.Broker) {
			out = append(out, c.Broker)
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// rates returns a system's msg/s per repeat.
func (r *InboxReport) rates(db, broker, system string) map[int]float64 {
	out := map[int]float64{}
	for _, c := range r.Cells {
		if c.DB == db && c.Broker == broker && c.System == system {
			out[c.Repeat] = c.MsgPS
		}
	}
	return out
}

// ratios are inbox ÷ hand-written per repeat.
func (r *InboxReport) ratios(db, broker string) []float64 {
	raw, ib := r.rates(db, broker, InboxRawName), r.rates(db, broker, InboxConsumerName)
	var out []float64
	for rep := range r.Opts.Repeats + len(r.Cells) {
		if a, ok := raw[rep]; ok && a > 0 {
			if b, ok := ib[rep]; ok {
				out = append(out, b/a)
			}
		}
	}
	return out
}

// dupStat returns a duplicate row's µs per call, in repeat order.
func (r *InboxReport) dupStat(db, system string) []float64 {
	var out []float64
	for _, c := range r.Dups {
		if c.DB == db && c.System == system {
			out = append(out, float64(c.PerOp)/float64(time.Microsecond))
		}
	}
	return out
}

// Write writes the section "Inbox".
func (r *InboxReport) Write(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("## Inbox")
	p("")
	if r.Header != "" {
		p("%s", r.Header)
		p("")
	}
	p("**Consumption.** Each cell starts with %d messages already on the broker (a ~%d-byte JSON payload and a `txoutbox-id` header, distinct ids) and consumes them all with %d handled at once; msg/s = %d ÷ (the N-th commit − the first message's handling), so the stream setup and the Kafka group join are outside it. Per message both systems run one transaction: the dedupe row (inbox: `inbox.Handle`'s INSERT into the migrated `<table>_inbox`; hand-written: `INSERT IGNORE` / `ON CONFLICT DO NOTHING` into a table of (consumer, message id, received at) with the same primary key and an index on the time, as a hand-written inbox with a retention needs), the effect (one INSERT of the id and payload into a business table), COMMIT, then the ack. *NATS JetStream*: one durable pull consumer, `Messages(PullMaxMessages(%d))`, %d workers, `Ack()` after the commit; the inbox row is `natsoutbox.Consumer`. *Kafka*: a franz-go consumer group on an in-process kfake broker, a topic of %d partitions, `PollRecords(100)`, the partitions of a poll in parallel and each partition's records in order, `CommitRecords` after the poll's commits; the inbox row is `kafkaoutbox.Consumer` (the same loop). The hand-written loop and the inbox consumer alternate which runs first from one repeat to the next. Both do the same database work per message (two INSERTs and a COMMIT, which bounds the rate), so the expected ratio is a little under 1; a ratio above 1 is noise, not a speed-up: read the medians next to the per-repeat pairs.",
		r.Opts.N, len(Payload(123456)), r.Opts.Concurrency, r.Opts.N, r.Opts.Concurrency, r.Opts.Concurrency, r.Opts.Concurrency)
	p("")
	p("| database | broker | hand-written loop msg/s | inbox consumer msg/s | inbox ÷ hand-written | per repeat (hand-written / inbox) |")
	p("| --- | --- | ---: | ---: | ---: | --- |")
	for _, db := range r.dbs() {
		for _, br := range r.brokers() {
			raw, ib := r.rates(db, br, InboxRawName), r.rates(db, br, InboxConsumerName)
			if len(raw) == 0 {
				continue
			}
			var per []string
			var rs, is []float64
			for rep := range len(r.Cells) {
				a, ok1 := raw[rep]
				b, ok2 := ib[rep]
				if ok1 && ok2 {
					rs, is = append(rs, a), append(is, b)
					per = append(per, fmt.Sprintf("%.0f / %.0f", a, b))
				}
			}
			p("| %s | %s | %s | %s | %s | %s |", db, br, statOf(rs).f(num), statOf(is).f(num), statOf(r.ratios(db, br)).f(ratio), strings.Join(per, "; "))
		}
	}
	p("")
	p("**Duplicates.** %d sequential calls of each, one at a time: the hand-written floor of a duplicate (BEGIN; SELECT 1 by the primary key; ROLLBACK), `inbox.Handle` of new messages (the dedupe row and one INSERT of the effect, COMMIT), and `Handle` of the same messages again, every one a duplicate. The three take turns by slices of %d messages, in a rotating order (a slice's duplicates after its new messages), so that they see the same load. *Statements* counts what runs in the handler's transaction (a `Config.Begin` that counts `ExecContext`); *rows written* is the change of the inbox and business tables' row counts around each slice. A duplicate is the dedupe INSERT finding the key (`INSERT IGNORE` on MySQL, `ON CONFLICT DO NOTHING` on PostgreSQL: one primary-key probe, 0 rows affected; on InnoDB it takes a shared lock on the existing row, no undo entry) and a ROLLBACK.",
		r.Opts.Dups, dupChunk)
	p("")
	p("| database | call | time per call | statements per call | handler calls per call | rows written per call |")
	p("| --- | --- | ---: | ---: | ---: | ---: |")
	for _, db := range r.dbs() {
		for _, sys := range []string{DupLookupName, DupFreshName, DupDupName} {
			var n, calls, written int64
			var stmts float64
			for _, c := range r.Dups {
				if c.DB == db && c.System == sys {
					n, calls, written, stmts = n+int64(c.N), calls+c.HandlerCalls, written+c.RowsWritten, c.Statements
				}
			}
			v := r.dupStat(db, sys)
			if len(v) == 0 || n == 0 {
				continue
			}
			cs, ws := fmt.Sprintf("%.2f", float64(calls)/float64(n)), fmt.Sprintf("%.2f", float64(written)/float64(n))
			if sys == DupLookupName {
				cs, ws = "—", "0"
			}
			p("| %s | %s | %s | %.0f | %s | %s |", db, sys, statOf(v).f(func(f float64) string { return fmt.Sprintf("%.0f µs", f) }), stmts, cs, ws)
		}
	}
}
