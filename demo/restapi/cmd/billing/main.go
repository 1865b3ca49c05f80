// Command billing is the demo's second service: it takes the orders
// service's events from NATS JetStream through the inbox and keeps
// invoices in a database of its own. Each message takes effect once, in
// one SQLite transaction with its inbox row, and is acked only after the
// commit; a redelivered message is a duplicate and changes nothing. In
// the same transaction the handler publishes InvoiceIssued or
// InvoiceVoided through billing's own outbox, so consume, transform and
// produce have an exactly-once effect.
//
//	go run ./demo/restapi/cmd/billing [-nats-url nats://127.0.0.1:4222] [-addr :8081] [-data data]
//
// Start the demo with NATS_URL set first: it creates the stream ORDERS.
// billing reads it with the durable consumer "billing" (from the first
// message; a restart goes on where it stopped) and serves its invoices at
// GET /invoices and the parked messages at GET /parked (and, with
// ADMIN_TOKEN, on the admin page at /admin/inbox). SIGINT or SIGTERM
// stops it: the messages being handled finish, the others go back.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	natsoutbox "github.com/txoutbox/txoutbox/adapters/nats"
	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	url := nats.DefaultURL
	if v := os.Getenv("NATS_URL"); v != "" {
		url = v
	}
	var o options
	flag.StringVar(&o.natsURL, "nats-url", url, "NATS server with JetStream (env NATS_URL)")
	flag.StringVar(&o.stream, "stream", "ORDERS", "stream of the orders service's events")
	flag.StringVar(&o.addr, "addr", ":8081", "address of GET /invoices and GET /parked")
	flag.StringVar(&o.dataDir, "data", "data", "directory of billing's SQLite database (billing.db)")
	flag.StringVar(&o.adminToken, "admin-token", os.Getenv("ADMIN_TOKEN"), "serve the admin page at /admin/ (parked messages: list, show, replay, purge) to those who present this token (env ADMIN_TOKEN); empty: none")
	flag.DurationVar(&o.retryDelay, "retry-delay", time.Second, "how long a message whose handler failed waits for its redelivery")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "billing:", err)
		os.Exit(1)
	}
}

type options struct {
	natsURL, stream, addr, dataDir string
	adminToken                     string
	// retryDelay is how long a failed message waits for its redelivery.
	retryDelay time.Duration
	// observe, if set, sees every inbox result, and listening the HTTP
	// address (the tests wait on them).
	observe   func(inbox.Observation)
	listening func(net.Addr)
}

// consumerName is the durable JetStream consumer and the inbox consumer.
const consumerName = "billing"

const schema = `CREATE TABLE IF NOT EXISTS invoices (
	order_id    INTEGER PRIMARY KEY,
	customer    TEXT NOT NULL,
	total_cents INTEGER NOT NULL,
	status      TEXT NOT NULL
)`

// run consumes until ctx ends, then closes everything it started.
func run(ctx context.Context, o options, stdout io.Writer, log *slog.Logger) (err error) {
	nc, cons, err := connect(ctx, o)
	if err != nil {
		return err
	}
	defer nc.Close()
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s (%w): choose another address with -addr", o.addr, err)
	}
	defer ln.Close()

	db, store, path, err := openDB(ctx, o.dataDir)
	if err != nil {
		return err
	}
	defer db.Close()
	ob, err := startOutbox(ctx, store, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ob.Close(context.WithoutCancel(ctx))) }()

	ib, err := inbox.New(db.DB, inbox.Config{Dialect: inbox.SQLite, Logger: log, Observe: observer(o, log)})
	if err != nil {
		return err
	}
	b := &billing{db: db, ob: ob, ib: ib}
	c, err := b.startConsumer(ctx, o, cons, log)
	if err != nil {
		return err
	}
	h, err := b.handler(o, store, log)
	if err != nil {
		c.Close(context.Background())
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "billing: consuming stream %s on %s through the inbox into %s; invoices: curl -s localhost%s/invoices (Ctrl-C stops)\n",
		o.stream, nc.ConnectedUrlRedacted(), path, portOf(ln.Addr()))
	if o.listening != nil {
		o.listening(ln.Addr())
	}
	return shutdownWhenDone(ctx, srv, served, c)
}

// connect connects to NATS and creates (or updates) billing's durable
// consumer on o.stream. The caller closes the connection.
func connect(ctx context.Context, o options) (*nats.Conn, jetstream.Consumer, error) {
	nc, err := nats.Connect(o.natsURL, nats.Name("txoutbox-demo-billing"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w (is a NATS server running? set -nats-url or NATS_URL)", o.natsURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, o.stream, jetstream.ConsumerConfig{Durable: consumerName, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		nc.Close()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil, fmt.Errorf("no stream %s on %s yet: start the demo with NATS_URL=%s first (it creates the stream)", o.stream, o.natsURL, o.natsURL)
		}
		return nil, nil, fmt.Errorf("consumer %s on stream %s: %w", consumerName, o.stream, err)
	}
	return nc, cons, nil
}

// openDB opens billing's SQLite database, billing.db in dir (created if
// need be), with the invoices table and the outbox and inbox tables, and
// returns it, its outbox store and its path. The caller closes it.
func openDB(ctx context.Context, dir string) (*sqlx.DB, *sqlstore.Store, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, "", err
	}
	path := filepath.Join(dir, "billing.db")
	db, err := sqlx.Open("sqlite", sqlstore.SQLiteDSN(path))
	if err != nil {
		return nil, nil, "", err
	}
	store, err := migrate(ctx, db)
	if err != nil {
		db.Close()
		return nil, nil, "", err
	}
	return db, store, path, nil
}

// migrate creates billing's tables in db: the invoices table, and the
// outbox and inbox tables of the store it returns.
func migrate(ctx context.Context, db *sqlx.DB) (*sqlstore.Store, error) {
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("create the invoices table: %w", err)
	}
	store, err := sqlstore.New(db, sqlstore.Options{})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil { // the outbox and inbox tables
		return nil, err
	}
	return store, nil
}

// startOutbox starts billing's outbox on store, with a handler that logs
// each event. It runs until Close, past the end of ctx.
func startOutbox(ctx context.Context, store *sqlstore.Store, log *slog.Logger) (*outbox.Outbox, error) {
	ob, err := outbox.New(store, outbox.Config{Logger: log})
	if err != nil {
		return nil, err
	}
	// billing's own listener; a real service would forward these events
	// with a connector, as the orders service does.
	ob.Handle("log", func(_ context.Context, ev outbox.Event) error {
		log.Info("billing event delivered", slog.String("event_id", ev.ID), slog.String("event_type", ev.Type.String()), slog.String("invoice", ev.AggregateID))
		return nil
	})
	// The engine and the consumer outlive ctx (Ctrl-C): Close stops them,
	// letting what is in flight finish.
	if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return ob, nil
}

// observer is the inbox's Observe: it logs each result and passes it on
// to o.observe, if set.
func observer(o options, log *slog.Logger) func(inbox.Observation) {
	return func(obs inbox.Observation) {
		log.Info("order event", slog.String("message_id", obs.MessageID), slog.String("result", obs.Result.String()))
		if o.observe != nil {
			o.observe(obs)
		}
	}
}

// startConsumer starts consuming cons through b's inbox into b.handle. It
// runs until Close, past the end of ctx.
func (b *billing) startConsumer(ctx context.Context, o options, cons jetstream.Consumer, log *slog.Logger) (*natsoutbox.Consumer, error) {
	c, err := natsoutbox.NewConsumer(natsoutbox.ConsumerConfig{Inbox: b.ib, Name: consumerName, Consumer: cons, Handler: b.handle,
		Concurrency: 1, RetryDelay: o.retryDelay, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := c.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return c, nil
}

// handler is billing's HTTP handler: its routes, and with o.adminToken
// the admin page at /admin/.
func (b *billing) handler(o options, store *sqlstore.Store, log *slog.Logger) (http.Handler, error) {
	mux := b.routes()
	if o.adminToken != "" {
		// The parked messages on the admin page; a replay runs b.handle.
		h, err := admin.New(b.ob, admin.Config{Authorize: admin.Token(o.adminToken), Realm: "txoutbox demo billing", BasePath: "/admin",
			Store: store, Logger: log, Inbox: b.ib, InboxHandlers: map[string]inbox.Handler{consumerName: b.handle}})
		if err != nil {
			return nil, err
		}
		mux.Handle("/admin/", h)
	}
	return mux, nil
}

// shutdownWhenDone waits for ctx to end, then shuts srv down and closes
// c, giving what is in flight 15 seconds; served delivers the result of
// srv.Serve. If serving fails first, it closes c and returns the failure.
func shutdownWhenDone(ctx context.Context, srv *http.Server, served <-chan error, c *natsoutbox.Consumer) error {
	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("serve: %w", err), c.Close(context.Background()))
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	err := errors.Join(srv.Shutdown(sctx), c.Close(sctx))
	<-served
	return err
}

func portOf(a net.Addr) string {
	if _, port, err := net.SplitHostPort(a.String()); err == nil {
		return ":" + port
	}
	return ""
}

type billing struct {
	db *sqlx.DB
	ob *outbox.Outbox
	ib *inbox.Inbox
}

// The orders service's payloads (demo/restapi/orders.go).
type order struct {
	OrderID    int64  `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

// handle applies one order event in the inbox's transaction: an invoice
// for OrderPlaced, voided by OrderCancelled, each with an event through
// billing's outbox in the same transaction. Other types are recorded and
// ignored. An error rolls it all back; the message comes again after
// RetryDelay and is parked after the inbox's MaxAttempts (5).
func (b *billing) handle(ctx context.Context, m inbox.Message) error {
	typ := m.Headers[meta.Type]
	if typ != "OrderPlaced" && typ != "OrderCancelled" {
		return nil
	}
	var o order
	if err := json.Unmarshal(m.Payload, &o); err != nil || o.OrderID <= 0 {
		return fmt.Errorf("%s: payload is not an order (%v)", typ, err)
	}
	tx := inbox.Tx(ctx)
	id := strconv.FormatInt(o.OrderID, 10)
	var res sql.Result
	var err error
	out := outbox.Envelope{AggregateType: "invoice", AggregateID: id}
	if typ == "OrderPlaced" {
		out.Type = "InvoiceIssued"
		res, err = tx.ExecContext(ctx, `INSERT INTO invoices (order_id, customer, total_cents, status) VALUES (?, ?, ?, 'open')`, o.OrderID, o.Customer, o.TotalCents)
	} else {
		out.Type = "InvoiceVoided"
		res, err = tx.ExecContext(ctx, `UPDATE invoices SET status = 'void' WHERE order_id = ? AND status = 'open'`, o.OrderID)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%s: no open invoice for order %d yet", typ, o.OrderID)
	}
	out.JSON, _ = json.Marshal(map[string]any{"order_id": o.OrderID, "total_cents": o.TotalCents})
	_, err = outbox.Publish(outbox.NewContext(ctx, b.ob), out)
	return err
}

type invoice struct {
	OrderID    int64  `json:"order_id" db:"order_id"`
	Customer   string `json:"customer" db:"customer"`
	TotalCents int64  `json:"total_cents" db:"total_cents"`
	Status     string `json:"status" db:"status"`
}

func (b *billing) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /invoices", func(w http.ResponseWriter, r *http.Request) {
		invoices := []invoice{}
		if err := b.db.SelectContext(r.Context(), &invoices, `SELECT order_id, customer, total_cents, status FROM invoices ORDER BY order_id`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, map[string]any{"invoices": invoices})
	})
	mux.HandleFunc("GET /parked", func(w http.ResponseWriter, r *http.Request) {
		entries, err := b.ib.Parked(r.Context(), inbox.ParkedFilter{Consumer: consumerName})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		type parked struct {
			ID        string    `json:"id"`
			Attempts  int       `json:"attempts"`
			LastError string    `json:"last_error"`
			ParkedAt  time.Time `json:"parked_at"`
		}
		out := []parked{}
		for _, e := range entries { // never the payload
			out = append(out, parked{e.Message.ID, e.Attempts, e.LastError, e.ReceivedAt})
		}
		writeJSON(w, map[string]any{"parked": out})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
