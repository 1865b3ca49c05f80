// Package testbroker finds the real message brokers that connector tests
// run against (NATS JetStream, RabbitMQ, Redis) and cuts connections to
// them on purpose with a TCP proxy, so that an outage test never stops a
// shared server.
//
// A broker that cannot be reached makes the test skip with a message that
// says how to provide it, unless TXOUTBOX_REQUIRE_DB or
// TXOUTBOX_REQUIRE_BROKERS is set (.ci/run sets both): then the test fails.
//
// Environment:
//
//	TXOUTBOX_NATS_URL   default nats://127.0.0.1:4222
//	TXOUTBOX_AMQP_URL   default amqp://guest:guest@127.0.0.1:5672/
//	TXOUTBOX_REDIS_ADDR default 127.0.0.1:6379
//
// The package imports only the standard library, so that a connector's
// module gets no dependency from it.
package testbroker

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"
)

// Default addresses of the brokers on a developer's machine and in CI.
const (
	DefaultNATSURL   = "nats://127.0.0.1:4222"
	DefaultAMQPURL   = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultRedisAddr = "127.0.0.1:6379"
)

// Required reports whether an unreachable broker must fail the test.
func Required() bool {
	return os.Getenv("TXOUTBOX_REQUIRE_BROKERS") != "" || os.Getenv("TXOUTBOX_REQUIRE_DB") != ""
}

// NATS returns the URL of the NATS server (with JetStream) tests use, or
// skips (fails when required) if it does not answer.
func NATS(t testing.TB) string {
	return reach(t, "NATS", "TXOUTBOX_NATS_URL", DefaultNATSURL)
}

// AMQP returns the URL of the RabbitMQ server tests use.
func AMQP(t testing.TB) string {
	return reach(t, "RabbitMQ", "TXOUTBOX_AMQP_URL", DefaultAMQPURL)
}

// Redis returns the address (host:port) of the Redis server tests use.
func Redis(t testing.TB) string {
	return reach(t, "Redis", "TXOUTBOX_REDIS_ADDR", DefaultRedisAddr)
}

func reach(t testing.TB, what, envVar, def string) string {
	t.Helper()
	v := os.Getenv(envVar)
	if v == "" {
		v = def
	}
	addr, err := HostPort(v)
	if err == nil {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
			c.Close()
			return v
		}
	}
	msg := fmt.Sprintf("%s not reachable at %s (%v): start it or set %s", what, v, err, envVar)
	if Required() {
		t.Fatal(msg)
	}
	NoteSkip(what, envVar)
	t.Skip(msg)
	return ""
}

// HostPort returns the host:port of a broker URL (nats://h:p, amqp://u:p@h:p/)
// or of a bare host:port.
func HostPort(v string) (string, error) {
	if u, err := url.Parse(v); err == nil && u.Host != "" {
		return u.Host, nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return "", fmt.Errorf("testbroker: %q is neither a URL nor host:port", v)
	}
	return v, nil
}

// WithHost returns the broker URL v with its host:port replaced by addr
// (a bare host:port is replaced whole): how a test points a client at a
// Proxy.
func WithHost(v, addr string) string {
	if u, err := url.Parse(v); err == nil && u.Host != "" {
		u.Host = addr
		return u.String()
	}
	return addr
}

// NoteSkip appends a line for a suite that did not run (what: the
// server, envVar: how to provide it) to the file named by
// TXOUTBOX_SKIP_LOG, which make test prints at the end, so that a laptop
// without the servers sees what was skipped instead of a bare "ok".
// internal/testdb uses it too.
func NoteSkip(what, envVar string) {
	path := os.Getenv("TXOUTBOX_SKIP_LOG")
	if path == "" {
		return
	}
	pkg := "?"
	if wd, err := os.Getwd(); err == nil {
		pkg = wd
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "skipped: %s tests in %s (%s not reachable; set %s)\n", what, pkg, what, envVar)
}
