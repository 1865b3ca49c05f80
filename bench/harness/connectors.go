package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// The three ways an event reaches a broker in the connector table.
const (
	ConnRaw       = "raw client"
	ConnTxoutbox  = "txoutbox"
	ConnWatermill = "Watermill forwarder"
	// The drains: the same events committed first, then delivered.
	ConnTxDrain = "txoutbox, backlog drain"
	ConnWmDrain = "Watermill forwarder, backlog drain"
)

// ConnOptions tune the connector table.
type ConnOptions struct {
	Brokers   []string // default BrokerNames
	Addrs     BrokerAddrs
	N         int           // events per measurement; default 20000
	TxSize    int           // events per committed transaction; default 100
	Producers int           // concurrent producer transactions; default 4
	Timeout   time.Duration // bound on one measurement's wait for the last ack; default 2 min
	Log       func(format string, args ...any)
}

// Defaults fills in the zero fields.
func (o *ConnOptions) Defaults() {
	if len(o.Brokers) == 0 {
		o.Brokers = BrokerNames
	}
	if o.N <= 0 {
		o.N = 20000
	}
	if o.TxSize <= 0 {
		o.TxSize = 100
	}
	if o.Producers <= 0 {
		o.Producers = 4
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
}

// ConnCell is one measurement: N events to one broker one way.
type ConnCell struct {
	Broker, Way  string
	N            int
	Elapsed      time.Duration // first commit (raw: first publish) to last ack
	PerSec       float64       // acked events / Elapsed
	P50, P99     time.Duration // per event, commit → ack (raw: chunk sent → acked)
	CommitPerSec float64       // events committed per second while the producers ran (0 for raw)
	Acked        int64         // distinct events the publisher saw acked
	OnBroker     int64         // messages the destination holds after
	Lost         int64         // events not on the broker: max(N − acked, N − on broker)
	Err          string        // why the cell did not run or finished early
	Note         string        // txoutbox: the engine's claim and completion statements
}

// ConnResult is one broker's row of the table.
type ConnResult struct {
	Broker, Client     string
	Raw, Tx, Wm        ConnCell
	TxDrain, WmDrain   ConnCell
	WatermillPublisher string
	// TxPerWm and TxPerRaw compare the end-to-end rates (first commit to
	// last ack, producers running) with Watermill's and with the raw
	// client's; DrainPerRaw and DrainPerWm the backlog drains (the
	// delivery side alone).
	TxPerWm, TxPerRaw       float64
	DrainPerRaw, DrainPerWm float64
	MeetsWm, MeetsRaw       bool
	Verdict                 string
}

// RunConnectors measures every broker of o: raw publish, txoutbox with
// the broker's connector, Watermill's forwarder with the broker's
// Watermill publisher; each from MariaDB/MySQL db where an outbox is
// involved.
func RunConnectors(ctx context.Context, db *sqlx.DB, o ConnOptions) ([]ConnResult, error) {
	o.Defaults()
	db.SetMaxOpenConns(o.Producers + 16)
	db.SetMaxIdleConns(o.Producers + 16)
	var out []ConnResult
	for _, name := range o.Brokers {
		r, err := runBroker(ctx, db, name, o)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runBroker(ctx context.Context, db *sqlx.DB, name string, o ConnOptions) (ConnResult, error) {
	b, err := OpenBroker(ctx, name, o.Addrs)
	if err != nil {
		return ConnResult{}, fmt.Errorf("harness: broker %s: %w", name, err)
	}
	defer b.Close()
	r := ConnResult{Broker: b.Name(), Client: b.Client(), WatermillPublisher: watermillPublishers[name]}
	prefix := UniquePrefix("cb" + name)
	var note string
	cell := func(way, suffix string, run func(dest string, rec *Recorder, restart func()) error) ConnCell {
		note = ""
		c := measure(ctx, b, prefix+suffix, way, o, run)
		c.Note = note
		o.Log("%s, %s: %s", b.Name(), way, c)
		return c
	}
	r.Raw = cell(ConnRaw, "raw", func(dest string, rec *Recorder, _ func()) error { return runRaw(ctx, b, dest, o, rec) })
	r.Tx = cell(ConnTxoutbox, "tx", func(dest string, rec *Recorder, _ func()) error {
		return runTxoutbox(ctx, db, b, dest, prefix+"tx", o, rec, nil, &note)
	})
	r.TxDrain = cell(ConnTxDrain, "txd", func(dest string, rec *Recorder, restart func()) error {
		return runTxoutbox(ctx, db, b, dest, prefix+"txd", o, rec, restart, &note)
	})
	r.Wm = cell(ConnWatermill, "wm", func(dest string, rec *Recorder, _ func()) error {
		return runWatermill(ctx, db, b, dest, prefix+"wm", o, rec, nil)
	})
	r.WmDrain = cell(ConnWmDrain, "wmd", func(dest string, rec *Recorder, restart func()) error {
		return runWatermill(ctx, db, b, dest, prefix+"wmd", o, rec, restart)
	})
	r.judge()
	return r, ctx.Err()
}

// The targets of the connector table.
const (
	TargetPerWatermill = 3.0
	TargetPerRaw       = 0.9
)

func (r *ConnResult) judge() {
	ok := func(c ConnCell) bool { return c.Err == "" && c.Lost == 0 && c.PerSec > 0 }
	if ok(r.Tx) && ok(r.Raw) {
		r.TxPerRaw = r.Tx.PerSec / r.Raw.PerSec
		r.MeetsRaw = r.TxPerRaw >= TargetPerRaw
	}
	if ok(r.TxDrain) && ok(r.Raw) {
		r.DrainPerRaw = r.TxDrain.PerSec / r.Raw.PerSec
	}
	if ok(r.TxDrain) && r.WmDrain.PerSec > 0 {
		r.DrainPerWm = r.TxDrain.PerSec / r.WmDrain.PerSec
	}
	if ok(r.Tx) && r.Wm.PerSec > 0 {
		r.TxPerWm = r.Tx.PerSec / r.Wm.PerSec
		r.MeetsWm = r.TxPerWm >= TargetPerWatermill
	}
	switch {
	case r.Broker == (&nopBroker{}).Name():
		r.Verdict = "reference (no broker)"
	case !ok(r.Tx):
		r.Verdict = "FAIL: txoutbox " + cellProblem(r.Tx)
	case !ok(r.TxDrain):
		r.Verdict = "FAIL: txoutbox drain " + cellProblem(r.TxDrain)
	case r.TxPerWm == 0:
		r.Verdict = "no Watermill figure"
	case r.MeetsWm && r.MeetsRaw:
		r.Verdict = "meets both"
	case r.MeetsWm:
		r.Verdict = fmt.Sprintf("≥%.0f× Watermill; below %.1f× raw", TargetPerWatermill, TargetPerRaw)
	case r.MeetsRaw:
		r.Verdict = fmt.Sprintf("≥%.1f× raw; below %.0f× Watermill", TargetPerRaw, TargetPerWatermill)
	default:
		r.Verdict = "misses both"
	}
}

func cellProblem(c ConnCell) string {
	if c.Err != "" {
		return c.Err
	}
	return fmt.Sprintf("lost %d", c.Lost)
}

func (c ConnCell) String() string {
	s := fmt.Sprintf("%d events in %v: %.0f/s (committed %.0f/s), p50 %v p99 %v, acked %d, on broker %d, lost %d",
		c.N, c.Elapsed.Round(time.Millisecond), c.PerSec, c.CommitPerSec, c.P50.Round(time.Microsecond), c.P99.Round(time.Microsecond), c.Acked, c.OnBroker, c.Lost)
	if c.Note != "" {
		s += "; " + c.Note
	}
	if c.Err != "" {
		s += " — " + c.Err
	}
	return s
}

// measure prepares dest, runs one way into it and checks the broker.
// A drain calls restart once the backlog is committed, which starts the
// clock again.
func measure(ctx context.Context, b Broker, dest, way string, o ConnOptions, run func(dest string, rec *Recorder, restart func()) error) ConnCell {
	c := ConnCell{Broker: b.Name(), Way: way, N: o.N}
	pctx, cancel := context.WithTimeout(ctx, brokerTimeout)
	defer cancel()
	if err := b.Prepare(pctx, dest); err != nil {
		c.Err = "prepare: " + trim(err.Error())
		return c
	}
	defer b.Remove(context.WithoutCancel(ctx), dest)
	rec := NewRecorder(o.N)
	start := rec.Since()
	drain := false
	if err := run(dest, rec, func() { start, drain = rec.Since(), true }); err != nil {
		c.Err = trim(err.Error())
	}
	c.Acked = rec.DeliveredCount()
	if way != ConnRaw && !drain {
		var lastCommit int64
		for i := range rec.commit {
			lastCommit = max(lastCommit, rec.commit[i].Load())
		}
		if d := time.Duration(lastCommit) - start; d > 0 {
			c.CommitPerSec = float64(rec.CommittedCount()) / d.Seconds()
		}
	}
	if last := rec.LastDelivery(); last > start {
		c.Elapsed = last - start
		c.PerSec = float64(c.Acked) / c.Elapsed.Seconds()
	}
	if !drain { // a backlog's latency is how long it waited
		lat, _ := rec.latencies()
		c.P50, c.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	}
	vctx, vcancel := context.WithTimeout(context.WithoutCancel(ctx), brokerTimeout)
	defer vcancel()
	n, err := b.Count(vctx, dest)
	if err != nil && c.Err == "" {
		c.Err = "count: " + trim(err.Error())
	}
	c.OnBroker = n
	c.Lost = max(int64(o.N)-c.Acked, int64(o.N)-n, 0)
	return c
}

func runRaw(ctx context.Context, b Broker, dest string, o ConnOptions, rec *Recorder) error {
	payloads := make([][]byte, o.N)
	for i := range payloads {
		payloads[i] = Payload(int64(i))
		rec.Next()
	}
	chunk := outbox.DefaultBatchSize
	sent := rec.Since()
	return b.Raw(ctx, dest, payloads, chunk, func(from, to int) {
		for i := from; i < to; i++ {
			// The chunk's send time stands in for the commit.
			rec.commit[i].Store(max(1, int64(sent)))
			rec.Delivered(int64(i))
		}
		sent = rec.Since()
	})
}

// produce runs o.Producers producers committing o.TxSize events per
// transaction until o.N events committed; tx commits one transaction of
// the events first…first+n−1 and records their commit.
func produce(ctx context.Context, o ConnOptions, rec *Recorder, tx func(ctx context.Context, seqs []int64) error) error {
	var wg sync.WaitGroup
	errs := make([]error, o.Producers)
	for w := range o.Producers {
		wg.Go(func() {
			seqs := make([]int64, 0, o.TxSize)
			for ctx.Err() == nil {
				seqs = seqs[:0]
				for range o.TxSize {
					s, ok := rec.Next()
					if !ok {
						break
					}
					seqs = append(seqs, s)
				}
				if len(seqs) == 0 {
					return
				}
				if err := tx(ctx, seqs); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// await waits until every event is acked, nothing arrived for stall, or
// the timeout passed.
func await(ctx context.Context, rec *Recorder, n int, timeout time.Duration) error {
	// Longer than outbox.DefaultLease: an event whose hot-path lease
	// could not be released waits that long, late but not lost.
	const stall = 45 * time.Second
	end := time.Now().Add(timeout)
	last, lastChange := rec.DeliveredCount(), time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for rec.DeliveredCount() < int64(n) {
		if time.Now().After(end) {
			return fmt.Errorf("timed out with %d of %d acked", rec.DeliveredCount(), n)
		}
		if time.Since(lastChange) > stall {
			return fmt.Errorf("no ack for %v with %d of %d acked", stall, rec.DeliveredCount(), n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if c := rec.DeliveredCount(); c != last {
			last, lastChange = c, time.Now()
		}
	}
	return nil
}

// runTxoutbox: producers commit events to the outbox table; the engine's
// Batch subscription hands them to the connector; an event is acked when
// the batch handler returns success for it.
//
// With drain set, the producers commit every event before the engine
// starts; drain is called then.
func runTxoutbox(ctx context.Context, db *sqlx.DB, b Broker, dest, prefix string, o ConnOptions, rec *Recorder, drain func(), note *string) (err error) {
	st, err := newStore(ctx, db, prefix+"_ob")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dropTables(context.WithoutCancel(ctx), db, storeTables(st)...)) }()
	ts := &timingStore{Store: st}
	ob, err := outbox.New(ts, outbox.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	defer func() { *note = ts.String() }()
	// The producers' outbox: the engine itself, or for a drain another
	// instance that never starts (no hot path), as if the backlog was
	// committed while the engine was down. Committed through the engine
	// before its Start, the events would take hot-path leases: the hot
	// queue and the overflow list (1000 + 10000) full, the rest would wait
	// out their lease (30 s).
	pob := ob
	if drain != nil {
		if pob, err = outbox.New(st, outbox.Config{Logger: quietLogger(), DisableHotPath: true}); err != nil {
			return err
		}
	}
	h, release, err := b.Connector(dest)
	if err != nil {
		return err
	}
	defer release()
	err = ob.Subscribe(outbox.Subscription{Name: "to-broker", Types: []outbox.EventType{OrderPlaced}, Batch: func(ctx context.Context, evs []outbox.Event) error {
		err := h(ctx, evs)
		var be *outbox.BatchError
		switch {
		case err == nil:
			for i := range evs {
				rec.Delivered(seqOf(evs[i].AggregateID))
			}
		case errors.As(err, &be):
			for i := range evs {
				if i < len(be.Errs) && be.Errs[i] == nil {
					rec.Delivered(seqOf(evs[i].AggregateID))
				}
			}
		}
		return err
	}})
	if err != nil {
		return err
	}
	start := func() error {
		if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		return nil
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = errors.Join(err, ob.Close(cctx))
		cancel()
	}()
	if drain == nil {
		if err := start(); err != nil {
			return err
		}
	}
	perr := produce(ctx, o, rec, func(ctx context.Context, seqs []int64) error {
		tx, err := outbox.BeginTx(ctx, db.DB, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		tx.AfterCommit(func() {
			for _, s := range seqs {
				rec.Committed(s)
			}
		})
		envs := make([]outbox.Envelope, len(seqs))
		for i, s := range seqs {
			envs[i] = envelope(s, Payload(s))
		}
		if _, err := pob.PublishAllTx(ctx, tx, envs...); err != nil {
			return err
		}
		return tx.Commit()
	})
	if perr != nil {
		return perr
	}
	if drain != nil {
		// A backlog is older than SkipRecent (1 s), the age below which the
		// poller leaves rows to the hot path; otherwise the last rows wait
		// for the next poll (PollInterval, 5 s) and that wait, not the
		// delivery, is measured. Aging the backlog is the point of this
		// pause, not synchronisation.
		time.Sleep(ob.Config().SkipRecent + 100*time.Millisecond)
		drain()
		if err := start(); err != nil {
			return err
		}
	}
	return await(ctx, rec, o.N, o.Timeout)
}

// watermillPublishers names the Watermill publisher of each broker.
var watermillPublishers = map[string]string{
	"nats":  "watermill-nats/v2 v2.1.3 (JetStream, sync PublishMsg per message)",
	"amqp":  "watermill-amqp v1.1.4 (streadway/amqp, NewDurableQueueConfig: no publisher confirms; v2/v3 are not on the module proxy)",
	"redis": "watermill-redisstream v1.4.5 (one XADD per message)",
	"kafka": "watermill-kafka/v3 v3.0.6 (Sarama SyncProducer, one message per call)",
	"none":  "a message.Publisher that only counts",
}

// ackingPublisher records each message as acked when the Watermill
// publisher's Publish returns nil for it: the forwarder's equivalent of a
// batch handler returning.
type ackingPublisher struct {
	message.Publisher
	rec *Recorder
}

func (p ackingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		p.rec.Delivered(seqOf(m.Metadata.Get(wmSeqKey)))
	}
	return nil
}

// runWatermill: producers commit events through watermill-sql's
// forwarder.Publisher (tuned: 10 ms poll, batches of 1000); the forwarder
// republishes each to the broker's Watermill publisher.
//
// With drain set, the forwarder starts once every event is committed.
func runWatermill(ctx context.Context, db *sqlx.DB, b Broker, dest, prefix string, o ConnOptions, rec *Recorder, drain func()) (err error) {
	w := &Watermill{Tuned: true}
	if err := w.prepare(ctx, &Env{DB: db, Rec: rec, Prefix: prefix}); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dropTables(context.WithoutCancel(ctx), db, w.tables...)) }()
	pub, err := b.Watermill()
	if err != nil {
		return fmt.Errorf("watermill publisher: %w", err)
	}
	defer pub.Close()
	logger := watermill.NopLogger{}
	sub, err := wsql.NewSubscriber(db.DB, w.subscriberConfig(), logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, ackingPublisher{pub, rec}, logger, forwarder.Config{ForwarderTopic: wmForwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		_ = fwd.Close()
		cancel()
		wg.Wait()
	}()
	start := func() error {
		wg.Go(func() { _ = fwd.Run(runCtx) })
		select {
		case <-fwd.Running():
			return nil
		case <-time.After(30 * time.Second):
			return errors.New("watermill forwarder did not start")
		}
	}
	if drain == nil {
		if err := start(); err != nil {
			return err
		}
	}
	topic := b.WatermillTopic(dest)
	perr := produce(ctx, o, rec, func(ctx context.Context, seqs []int64) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		p, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: w.schema}, logger)
		if err != nil {
			return err
		}
		fp := forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: wmForwarderTopic})
		msgs := make([]*message.Message, len(seqs))
		for i, s := range seqs {
			msgs[i] = wmMessage(s, Payload(s))
		}
		if err := fp.Publish(topic, msgs...); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		for _, s := range seqs {
			rec.Committed(s)
		}
		return nil
	})
	if perr != nil {
		return perr
	}
	if drain != nil {
		drain()
		if err := start(); err != nil {
			return err
		}
	}
	return await(ctx, rec, o.N, o.Timeout)
}

// ConnNotes are the caveats of the connector table.
func ConnNotes() []string {
	return []string{
		"Watermill's forwarder publishes one message at a time and acks it in the SQL subscriber before taking the next; that, not the broker, bounds its rate. Its end-to-end runs can lose events for good: its SQL subscriber reads with an offset cursor, so a transaction that commits after a later-numbered one is skipped (see BENCHMARKS.md); the smoke test runs one producer for that reason.",
		"The end-to-end rate of txoutbox cannot pass what the producers commit (*committed/s*, MariaDB on the same 2 cores): against clients that publish tens of thousands of events per second from memory, ≥ 0.9× raw is out of reach by construction. The *none* row (no broker) is the database side's ceiling: where a broker's txoutbox rate is close to it, the connector costs little.",
		"The drains go through the poller alone: claims of PollBatchSize 200, one at a time, so the sum of the claim times is a floor under the drain's duration (compare the timing table with the drain's rate). The backlog is aged past SkipRecent (1 s) before Start; younger rows are left to the hot path and wait for the next poll (PollInterval 5 s), which a first version of this table measured instead of the delivery (2.8k events/s on every broker). The end-to-end runs go mostly through the hot path (compare the claimed rows with the 20000 events); events overflowing the hot queue are claimed by the poller once SkipRecent has passed, which is much of their p99. Committing more than HotQueueSize + 10000 events through an engine whose workers cannot keep up (for instance before Start) leaves the surplus leased until Lease (30 s) runs out: late, not lost; the drains commit through a second, never-started instance to avoid that.",
		"watermill-amqp v1.1.4 (the only version the module proxy serves; v2/v3 answer 404) publishes without publisher confirms: its Publish returns once the frame is written, not when RabbitMQ has the message, so its acked count is an upper bound and only the queue depth proves delivery.",
		"Kafka runs on franz-go's in-process kfake broker (no disk, same process as the bench), so its rates say more about the clients' CPU cost than about a real cluster; Watermill's Kafka publisher is Sarama's SyncProducer.",
		"The machine has 2 cores shared by MariaDB, the brokers and the bench; raw rates are the same client in the same run, not the brokers' ceilings.",
	}
}

// timingStore times the engine's claim and completion statements, to
// say where a drain's time goes.
type timingStore struct {
	*sqlstore.Store
	claims, claimed, claimNs atomic.Int64
	dones, done, doneNs      atomic.Int64
}

func (s *timingStore) Claim(ctx context.Context, req driver.ClaimRequest) ([]driver.Row, error) {
	t := time.Now()
	rows, err := s.Store.Claim(ctx, req)
	s.claims.Add(1)
	s.claimed.Add(int64(len(rows)))
	s.claimNs.Add(int64(time.Since(t)))
	return rows, err
}

func (s *timingStore) MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error) {
	t := time.Now()
	n, err := s.Store.MarkDone(ctx, owner, ids, registry)
	s.dones.Add(1)
	s.done.Add(int64(len(ids)))
	s.doneNs.Add(int64(time.Since(t)))
	return n, err
}

func (s *timingStore) String() string {
	per := func(ns, n int64) time.Duration { return time.Duration(ns / max(n, 1)).Round(time.Microsecond) }
	return fmt.Sprintf("%d claims of %d rows (mean %v, %v in all), %d MarkDone of %d ids (mean %v, %v in all)",
		s.claims.Load(), s.claimed.Load(), per(s.claimNs.Load(), s.claims.Load()), time.Duration(s.claimNs.Load()).Round(time.Millisecond),
		s.dones.Load(), s.done.Load(), per(s.doneNs.Load(), s.dones.Load()), time.Duration(s.doneNs.Load()).Round(time.Millisecond))
}
