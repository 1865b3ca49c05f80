package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"
	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	_ "modernc.org/sqlite" // driver "sqlite"

	"github.com/txoutbox/txoutbox/admin"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/prom"
)

var sqliteDSN = sqlstore.SQLiteDSN

// appOptions build an app. Tests set the fields after config.
type appOptions struct {
	config config
	logger *slog.Logger

	now         func() time.Time // clock of order timestamps; defaults to time.Now
	ordersTable string           // defaults to "orders"
	outboxTable string           // defaults to sqlstore.DefaultTable
	// wrapStore, if set, wraps the store the outbox engine uses.
	wrapStore func(driver.Store) driver.Store
	// wrapMetrics, if set, wraps the metrics the outbox engine reports to.
	wrapMetrics func(outbox.Metrics) outbox.Metrics
	// natsStream and natsSubjectPrefix default to "ORDERS" and "orders".
	natsStream, natsSubjectPrefix string
}

// app is the service: database, outbox, listeners and routes.
type app struct {
	db0     database
	db      *sqlx.DB
	store   *sqlstore.Store
	ob      *outbox.Outbox
	orders  *orders
	model   *readModel
	reg     *prometheus.Registry
	log     *slog.Logger
	now     func() time.Time
	ready   atomic.Bool
	handler http.Handler
	fwd     *forwarders
	admin   http.Handler // nil without ADMIN_TOKEN
}

// newApp opens the database, applies the migrations (the outbox table and
// the orders table), builds the outbox with its listeners and metrics, and
// the routes. It starts nothing; see start.
func newApp(ctx context.Context, o appOptions) (_ *app, err error) {
	log := o.logger
	if log == nil {
		log = slog.Default()
	}
	dbc, err := parseDSN(o.config.DSN, o.config.DataDir)
	if err != nil {
		return nil, err
	}
	if dbc.path != "" {
		if err := os.MkdirAll(filepath.Dir(dbc.path), 0o755); err != nil {
			return nil, fmt.Errorf("restapi: create data directory: %w", err)
		}
	}
	db, err := sqlx.Open(dbc.driver, dbc.dsn)
	if err != nil {
		return nil, fmt.Errorf("restapi: open %s: %w", dbc.display, err)
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = db.PingContext(pctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("restapi: connect to %s: %w", dbc.display, err)
	}
	if dbc.dialect == "sqlite" {
		// One writer at a time: the DSN's immediate transactions queue
		// writers behind a busy timeout, so a small pool is enough.
		db.SetMaxOpenConns(4)
	}

	store, err := sqlstore.New(db, sqlstore.Options{Table: o.outboxTable})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	ords := newOrders(dbc, cmp.Or(o.ordersTable, "orders"))
	if err := ords.migrate(ctx, db); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewDBStatsCollector(db.DB, "restapi"))
	metrics, err := prom.New(reg)
	if err != nil {
		return nil, err
	}

	var engineStore driver.Store = store
	if o.wrapStore != nil {
		engineStore = o.wrapStore(store)
	}
	var engineMetrics outbox.Metrics = metrics
	if o.wrapMetrics != nil {
		engineMetrics = o.wrapMetrics(metrics)
	}
	// Everything not set here keeps the engine's production defaults:
	// 4 workers, hot and cold queues of 1000, retries from 200ms to 60s
	// with jitter, dead after 10 attempts, 30s leases, 10s listener timeout.
	ob, err := outbox.New(engineStore, outbox.Config{
		PollInterval:    o.config.PollInterval,     // default 5s
		PollMaxInterval: 4 * o.config.PollInterval, // default 15s
		StatsInterval:   o.config.StatsInterval,    // default 15s
		Retention:       o.config.Retention,        // default: keep every row
		Logger:          log,
		Metrics:         engineMetrics,
	})
	if err != nil {
		return nil, err
	}

	clock := o.now
	if clock == nil {
		clock = time.Now
	}
	a := &app{db0: dbc, db: db, store: store, ob: ob, orders: ords, model: newReadModel(), reg: reg, log: log,
		// Order times are UTC with the microseconds every database keeps.
		now: func() time.Time { return clock().UTC().Truncate(time.Microsecond) }}
	if err := a.model.register(ob); err != nil {
		return nil, err
	}
	ob.Handle("log", logDelivered(log))
	if a.fwd, err = subscribeForwarders(ctx, o, ob, log); err != nil {
		return nil, err
	}
	if tok := o.config.AdminToken; tok != "" {
		// Outside the request transactions of /orders: the admin page's
		// writes (pause, replay) are the engine's own.
		if a.admin, err = admin.New(ob, admin.Config{Authorize: admin.Token(tok), Realm: "txoutbox demo",
			BasePath: "/admin", Store: store, Logger: log}); err != nil {
			return nil, err
		}
	}
	a.handler = a.router()
	return a, nil
}

// start starts delivering events and marks the service ready.
func (a *app) start(ctx context.Context) {
	// Cancelling Start's context stops the engine without draining; the
	// signal context ends at SIGTERM, before Close has drained the queues.
	if err := a.ob.Start(context.WithoutCancel(ctx)); err != nil {
		a.log.Error("start outbox", slog.Any("error", err))
		return
	}
	a.ready.Store(true)
}

// close drains the outbox (deliveries in flight finish, queued events go
// back to the table for the next start) and closes the database.
func (a *app) close(ctx context.Context) error {
	a.ready.Store(false)
	err := a.ob.Close(ctx)
	a.fwd.close() // after the outbox: it publishes until Close returns
	if s, serr := a.store.Stats(context.WithoutCancel(ctx)); serr == nil {
		a.log.Info("outbox closed", slog.Int64("pending", s.Pending()), slog.Int64("done", s.Done), slog.Int64("dead", s.Dead), slog.Int64("split", s.Split))
	}
	return errors.Join(err, a.db.Close())
}

func (a *app) router() http.Handler {
	r := chi.NewRouter()
	r.Use(chimw.Recoverer, a.logRequests)
	r.Route("/orders", a.routes)
	r.Get("/events/stats", a.eventStats)
	r.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) { writeText(w, http.StatusOK, "ok") })
	r.Get("/readyz", a.readyz)
	r.Handle("/livez", a.ob.LiveHandler())
	if a.admin != nil {
		r.Handle("/admin/*", a.admin)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path+"; try POST /orders, GET /orders, GET /events/stats or GET /metrics")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
	})
	return r
}

// readyz answers 200 while the service takes traffic: started, not
// shutting down, and the outbox ready, which it is when it runs and can
// write to the database (outbox.Health; its JSON is at /livez). The
// service's own flag goes first: it turns at the start of a shutdown,
// while the outbox still delivers.
func (a *app) readyz(w http.ResponseWriter, r *http.Request) {
	if !a.ready.Load() {
		writeText(w, http.StatusServiceUnavailable, "not ready: starting or shutting down")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if h := a.ob.Health(ctx); !h.Ready {
		// The client gets the names of the failed checks; their details
		// (database errors) go to the log.
		var names []string
		for _, c := range h.Checks {
			if c.Ready && !c.OK {
				names = append(names, c.Name)
				a.log.Warn("readiness: outbox check failed", slog.String("check", c.Name), slog.String("detail", c.Detail))
			}
		}
		writeText(w, http.StatusServiceUnavailable, "not ready: outbox check failed: "+strings.Join(names, ", "))
		return
	}
	writeText(w, http.StatusOK, "ready")
}

// logRequests logs one line per request.
func (a *app) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := chimw.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		a.log.LogAttrs(r.Context(), slog.LevelInfo, "request",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", ww.Status()), slog.Duration("took", time.Since(start)))
	})
}

// internal answers 500 and logs the cause, which the client never sees.
func (a *app) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.log.LogAttrs(r.Context(), slog.LevelError, what, slog.String("path", r.URL.Path), slog.Any("error", err))
	problem(w, http.StatusInternalServerError, what+" failed; see the server's log")
}

// problem answers with an RFC 9457 problem document.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	writeJSONBody(w, status, struct {
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{http.StatusText(status), status, detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	writeJSONBody(w, status, v)
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"title":"Internal Server Error","status":500}`)
	}
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	w.Write([]byte(s + "\n"))
}
