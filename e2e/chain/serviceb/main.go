// Command serviceb is service B of the chain test (e2e/chain): it
// consumes service A's events from a NATS JetStream durable with the
// inbox, and in each message's transaction writes an effect row and
// publishes an event through its own outbox to a webhook endpoint. The
// test kills it with SIGKILL at random moments and starts it again.
//
// It is configured by the environment (CHAIN_*, set by the test). Each
// inbox result is printed to stdout as "result <result> <message id>", so
// that the test can count the redeliveries the kills caused, and "ready"
// once it consumes. SIGTERM closes it gracefully.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // driver "sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// config is read from the environment.
type config struct {
	driver, dsn     string // database/sql driver name and DSN
	table, effects  string // B's outbox table (its inbox tables are named after it) and effects table
	natsURL         string
	stream, durable string // JetStream stream and durable consumer
	webhookURL      string
	secret          string
}

func main() {
	env := func(k string) string {
		v := os.Getenv(k)
		if v == "" {
			fmt.Fprintf(os.Stderr, "serviceb: %s is not set (the chain test sets it)\n", k)
			os.Exit(2)
		}
		return v
	}
	cfg := config{
		driver: env("CHAIN_DRIVER"), dsn: env("CHAIN_DSN"),
		table: env("CHAIN_TABLE"), effects: env("CHAIN_EFFECTS"),
		natsURL: env("CHAIN_NATS"), stream: env("CHAIN_STREAM"), durable: env("CHAIN_DURABLE"),
		webhookURL: env("CHAIN_WEBHOOK_URL"), secret: env("CHAIN_SECRET"),
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "serviceb:", err)
		os.Exit(1)
	}
}

// printer writes the inbox results to stdout, one line each.
type printer struct{ mu sync.Mutex }

func (p *printer) observe(o inbox.Observation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Printf("result %s %s\n", o.Result, o.MessageID)
}

func run(ctx context.Context, cfg config) error {
	db, err := sqlx.Open(cfg.driver, cfg.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := sqlstore.New(db, sqlstore.Options{Table: cfg.table})
	if err != nil {
		return err
	}
	// Short leases and polls: the events a killed instance held are taken
	// by the next one within seconds.
	ob, err := outbox.New(store, outbox.Config{
		PollInterval: 100 * time.Millisecond, PollMaxInterval: 500 * time.Millisecond, Lease: 3 * time.Second,
		Retry: outbox.ExponentialBackoff{Base: 50 * time.Millisecond, Max: 500 * time.Millisecond}, MaxAttempts: 1000,
	})
	if err != nil {
		return err
	}
	pub, err := webhook.New(webhook.Config{URL: cfg.webhookURL, Secret: cfg.secret})
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := ob.Subscribe(outbox.Subscription{Name: "to-receiver", Handler: pub.Handler()}); err != nil {
		return err
	}
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer ob.Close(context.Background())

	dialect, err := inbox.DialectNamed(store.Dialect().Name())
	if err != nil {
		return err
	}
	var p printer
	ib, err := inbox.New(db.DB, inbox.Config{Dialect: dialect, Table: cfg.table, Observe: p.observe})
	if err != nil {
		return err
	}
	insert := db.Rebind(`INSERT INTO ` + cfg.effects + ` (a_id) VALUES (?)`)
	handler := func(ctx context.Context, m inbox.Message) error {
		p.mu.Lock()
		fmt.Printf("begin %s\n", m.ID)
		p.mu.Unlock()
		if _, err := inbox.Tx(ctx).ExecContext(ctx, insert, m.ID); err != nil {
			return err
		}
		// Some work with the transaction open, so that a kill often
		// lands inside one.
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		body, err := json.Marshal(map[string]string{"a_id": m.ID})
		if err != nil {
			return err
		}
		_, err = outbox.Publish(outbox.NewContext(ctx, ob), outbox.Envelope{Type: "b.applied", AggregateType: "a-event", AggregateID: m.ID, JSON: body})
		return err
	}

	nc, err := nats.Connect(cfg.natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, cfg.stream, cfg.durable)
	if err != nil {
		return fmt.Errorf("the durable %s on %s: %w", cfg.durable, cfg.stream, err)
	}
	c, err := natsoutbox.NewConsumer(natsoutbox.ConsumerConfig{Inbox: ib, Name: "service-b", Consumer: cons, Handler: handler,
		RetryDelay: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	fmt.Println("ready")
	p.mu.Unlock()
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return errors.Join(c.Close(cctx), ob.Close(cctx))
}
