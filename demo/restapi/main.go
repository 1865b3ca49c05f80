// Command restapi is the txoutbox demo: an orders service on chi whose
// handlers write an order and publish an event in one transaction, with
// listeners that log each delivered event and keep a small read model.
//
// Run it from the repository's root with no server to install:
//
//	make run   # = go run ./demo/restapi
//
// It keeps its SQLite database in ./data, applies the migrations at start,
// and listens on :8080. DATABASE_URL (or -dsn) switches to MySQL/MariaDB or
// PostgreSQL. SIGINT or SIGTERM stops it gracefully: it finishes the
// requests in flight, then drains the outbox. README.md in this directory
// walks through it with curl.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, log); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// config is what the flags and the environment set.
type config struct {
	Addr            string
	DSN             string
	DataDir         string
	PollInterval    time.Duration
	StatsInterval   time.Duration
	Retention       time.Duration
	ShutdownTimeout time.Duration
	NATSURL         string
	WebhookURL      string
	WebhookSecret   string
	AdminToken      string
}

// flagDef is one flag and the environment variable that sets its default.
type flagDef struct {
	name, env, usage string
	str              *string
	dur              *time.Duration
	def              string
}

// flagDefs lists the demo's flags; docker-compose.yml sets them through
// the environment variables named here (a test checks that it does).
func flagDefs(c *config) []flagDef {
	return []flagDef{
		{name: "addr", env: "ADDR", str: &c.Addr, def: ":8080", usage: "address to listen on"},
		{name: "dsn", env: "DATABASE_URL", str: &c.DSN, def: "", usage: "database: mysql://user:password@host:3306/db, postgres://user:password@host:5432/db or sqlite:file.db; empty: SQLite in the data directory"},
		{name: "data", env: "DATA_DIR", str: &c.DataDir, def: "data", usage: "directory of the SQLite database when no DSN is given"},
		// The engine's default is 5s (idle back-off up to 15s). The demo
		// polls more often so that retries and events left to the poller
		// show up while you watch; the hot path does not wait for it.
		{name: "poll-interval", env: "POLL_INTERVAL", dur: &c.PollInterval, def: "500ms", usage: "how often the poller looks for due events (engine default 5s)"},
		// The engine's default is 15s.
		{name: "stats-interval", env: "STATS_INTERVAL", dur: &c.StatsInterval, def: "2s", usage: "how often the backlog gauges of /metrics are sampled (engine default 15s)"},
		// The engine's default keeps every row.
		{name: "retention", env: "RETENTION", dur: &c.Retention, def: "168h", usage: "delivered events older than this are deleted, hourly (engine default: kept)"},
		{name: "shutdown-timeout", env: "SHUTDOWN_TIMEOUT", dur: &c.ShutdownTimeout, def: "15s", usage: "how long a shutdown waits for requests and deliveries in flight"},
		// The connectors: each configured one is a subscription of its own.
		{name: "nats-url", env: "NATS_URL", str: &c.NATSURL, def: "", usage: "NATS server with JetStream, e.g. nats://127.0.0.1:4222: forward every event to the stream " + natsStream + ", subjects " + natsSubjectPrefix + ".<type>; empty: no NATS"},
		{name: "webhook-url", env: "WEBHOOK_URL", str: &c.WebhookURL, def: "", usage: "endpoint every event is POSTed to, signed the Standard Webhooks way; empty: no webhook"},
		{name: "webhook-secret", env: "WEBHOOK_SECRET", str: &c.WebhookSecret, def: "", usage: "whsec_... secret that signs the webhook requests (prefer the variable: flags show in ps)"},
		{name: "admin-token", env: "ADMIN_TOKEN", str: &c.AdminToken, def: "", usage: "serve the admin page and API at /admin/ to those who present this token (Bearer, or Basic with it as the password); empty: no admin page"},
	}
}

// parseConfig reads the flags in args over defaults taken from the
// environment.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("restapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, d := range flagDefs(&c) {
		def := d.def
		if v := getenv(d.env); v != "" {
			def = v
		}
		usage := d.usage + " (env " + d.env + ")"
		if d.str != nil {
			fs.StringVar(d.str, d.name, def, usage)
			continue
		}
		v, err := time.ParseDuration(def)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("restapi: %s=%q: want a positive duration such as 500ms or 5s", d.env, def)
		}
		fs.DurationVar(d.dur, d.name, v, usage)
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("restapi: unexpected arguments %q; see -help", fs.Args())
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"poll-interval", c.PollInterval}, {"stats-interval", c.StatsInterval}, {"retention", c.Retention}, {"shutdown-timeout", c.ShutdownTimeout}} {
		if d.v <= 0 {
			return c, fmt.Errorf("restapi: -%s is %v; it must be positive", d.name, d.v)
		}
	}
	return c, nil
}

// run starts the service and blocks until ctx is done or SIGINT/SIGTERM
// arrives, then shuts down gracefully. It prints where it listens to
// stdout and logs to log.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, log *slog.Logger) error {
	cfg, err := parseConfig(args, getenv, stdout)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Listen first: a taken address fails before anything has started.
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("restapi: cannot listen on %s (%w); is another process using it? Choose another address with -addr or ADDR, e.g. ADDR=:8081 make run", cfg.Addr, err)
	}
	a, err := newApp(ctx, appOptions{config: cfg, logger: log})
	if err != nil {
		ln.Close()
		return err
	}
	a.start(ctx)
	srv := &http.Server{
		Handler: a.handler,
		// Bound slow clients: the headers, and the whole request with its
		// body (decodeBody also caps the body with http.MaxBytesReader).
		// The transaction begins at the handler's first use of it, after
		// the body is read, so a slow body holds no pooled connection.
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	banner(stdout, a.db0.display, ln.Addr())

	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("restapi: serve: %w", err), a.close(context.Background()))
	}
	stop() // a second Ctrl-C now kills the process the usual way
	log.Info("shutting down: finishing requests in flight, then draining the outbox", slog.Duration("timeout", cfg.ShutdownTimeout))
	a.ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if cerr := a.close(sctx); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("restapi: shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// tryBody is the order the banner's curl creates; the README starts with it.
const tryBody = `{"customer":"ada","items":[{"sku":"book","qty":2,"price_cents":1250}]}`

func banner(w io.Writer, db string, addr net.Addr) {
	base := "localhost"
	if host, port, err := net.SplitHostPort(addr.String()); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			base = host
		}
		base = net.JoinHostPort(base, port)
	}
	fmt.Fprintf(w, "txoutbox demo: orders API listening on http://%s (database: %s)\n", base, db)
	fmt.Fprintf(w, "try:  curl -s %s/orders -d '%s'\n", base, tryBody)
	fmt.Fprintf(w, "then: curl -s %s/events/stats   (walkthrough: demo/restapi/README.md; metrics: /metrics; stop: Ctrl-C)\n", base)
}

// envNames returns the environment variables the demo reads.
func envNames() []string {
	var c config
	var out []string
	for _, d := range flagDefs(&c) {
		out = append(out, d.env)
	}
	return out
}
