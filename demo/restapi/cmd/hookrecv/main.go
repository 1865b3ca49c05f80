// Command hookrecv is a webhook receiver for the demo: it verifies the
// Standard Webhooks signature of every request with webhook.Verify and
// prints what it received.
//
//	go run ./demo/restapi/cmd/hookrecv [-addr localhost:9090]
//
// It takes the secret from WEBHOOK_SECRET, or makes one and prints it
// with the command that starts the demo against it. A request whose
// signature does not verify is answered 401 (the demo's outbox then marks
// the event DEAD: a 4xx is permanent); a redelivery (a webhook-id already
// seen) is answered 204 again and printed as a duplicate, as a receiver
// that de-duplicates would.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// path is where the receiver takes the demo's events.
const path = "/hooks/orders"

// maxBody is what the receiver reads of a request; the demo's connector
// refuses bigger events (webhook.Config.MaxBodyBytes) without sending them.
const maxBody = 1 << 20

func main() {
	addr := flag.String("addr", "localhost:9090", "address to listen on")
	flag.Parse()
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, os.Getenv("WEBHOOK_SECRET"), os.Stdout); err != nil {
		log.Fatal("hookrecv: ", err)
	}
}

func run(ctx context.Context, addr, secret string, out io.Writer) error {
	if secret == "" {
		secret = webhook.NewSecret()
	} else if _, err := webhook.Sign(secret, "check", time.Now(), nil); err != nil {
		return fmt.Errorf("WEBHOOK_SECRET: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (choose another with -addr)", addr, err)
	}
	url := "http://" + displayAddr(addr, ln.Addr()) + path
	fmt.Fprintf(out, "hookrecv: verifying and printing the webhooks POSTed to %s (Ctrl-C stops)\n", url)
	fmt.Fprintf(out, "start the demo against it, from the repository's root:\n  WEBHOOK_URL=%s WEBHOOK_SECRET=%s make run\n", url, secret)
	srv := &http.Server{Handler: newReceiver(secret, out), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// displayAddr is the host of -addr (localhost when it has none) with
// the port listened on.
func displayAddr(addr string, ln net.Addr) string {
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	_, port, _ := net.SplitHostPort(ln.String())
	return net.JoinHostPort(host, port)
}

// receiver verifies and prints the requests; safe for concurrent requests.
type receiver struct {
	secret string
	mu     sync.Mutex
	out    io.Writer
	seen   map[string]bool // webhook-id: delivery is at least once
}

func newReceiver(secret string, out io.Writer) *receiver {
	return &receiver{secret: secret, out: out, seen: map[string]bool{}}
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != path {
		http.Error(w, "POST "+path+" only", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	id := r.Header.Get("webhook-id")
	if err := webhook.Verify(rc.secret, r.Header, body, 5*time.Minute); err != nil {
		rc.printf("REJECTED webhook-id=%q: %v (is WEBHOOK_SECRET the same on both sides?)\n", id, err)
		http.Error(w, "signature does not verify", http.StatusUnauthorized)
		return
	}
	rc.mu.Lock()
	dup := rc.seen[id]
	rc.seen[id] = true
	rc.mu.Unlock()
	if dup {
		rc.printf("duplicate webhook-id=%s: already received, answered 204 again\n", id)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var compact bytes.Buffer
	shown := fmt.Sprintf("%q", body)
	if json.Compact(&compact, body) == nil {
		shown = compact.String()
	}
	rc.printf("POST %s  webhook-id=%s  %s=%s  aggregate=%s/%s  signature verified\n    %s\n", r.URL.Path, id,
		meta.Type, r.Header.Get(meta.Type), r.Header.Get(meta.AggregateType), r.Header.Get(meta.AggregateID), shown)
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) printf(format string, args ...any) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	fmt.Fprintf(rc.out, format, args...)
}
