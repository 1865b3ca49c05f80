package webhook_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
)

// secretOf returns a secret of n random key bytes.
func secretOf(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return webhook.SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// Event headers never become credentials at the receiver, nor reach the
// connection: Authorization and Cookie go only when Config.ForwardHeaders
// names them; Proxy-Authorization and the hop-by-hop headers never.
func TestCredentialAndHopByHopHeadersNotForwarded(t *testing.T) {
	secret := webhook.NewSecret()
	dropped := map[string]string{
		"authorization": "Bearer event", "Cookie": "session=event", "proxy-authorization": "Basic ZXZlbnQ=",
		"connection": "close", "keep-alive": "timeout=5", "proxy-connection": "keep-alive", "te": "trailers",
		"trailer": "X-T", "upgrade": "websocket", "transfer-encoding": "chunked", "expect": "100-continue",
		"host": "evil.example",
	}
	headers := map[string]string{"x-kept": "yes"}
	for k, v := range dropped {
		headers[k] = v
	}
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`), Headers: headers}}

	rcv := newReceiver(t, secret)
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret})
	if err := pub.Send(context.Background(), &ev); err != nil {
		t.Fatal(err)
	}
	p := rcv.Posts()[0]
	if p.VerifyErr != nil || p.Header.Get("X-Kept") != "yes" {
		t.Fatalf("verify %v, X-Kept %q", p.VerifyErr, p.Header.Get("X-Kept"))
	}
	for k, v := range dropped {
		if got := p.Header.Values(k); len(got) > 0 && strings.Contains(strings.Join(got, ","), v) {
			t.Errorf("event header %s reached the receiver: %q", k, got)
		}
	}

	// Named in ForwardHeaders, the credentials an event carries go on; the
	// rest stays dropped.
	rcv2 := newReceiver(t, secret)
	pub2 := newPublisher(t, webhook.Config{URL: rcv2.URL(), Secret: secret, ForwardHeaders: []string{"authorization", "Cookie"}})
	if err := pub2.Send(context.Background(), &ev); err != nil {
		t.Fatal(err)
	}
	p = rcv2.Posts()[0]
	if p.Header.Get("Authorization") != "Bearer event" || p.Header.Get("Cookie") != "session=event" || p.Header.Get("Proxy-Authorization") != "" {
		t.Fatalf("with ForwardHeaders: Authorization %q, Cookie %q, Proxy-Authorization %q", p.Header.Get("Authorization"), p.Header.Get("Cookie"), p.Header.Get("Proxy-Authorization"))
	}

	// ForwardHeaders names only what would otherwise be dropped and can be
	// forwarded.
	for _, name := range []string{"Proxy-Authorization", "Connection", "webhook-signature", "X-Kept", "bad name"} {
		_, err := webhook.New(webhook.Config{URL: rcv.URL(), Secret: secret, ForwardHeaders: []string{name}})
		if err == nil || !strings.Contains(err.Error(), "ForwardHeaders") {
			t.Errorf("ForwardHeaders %q: %v, want an error naming ForwardHeaders", name, err)
		}
	}
}

// Standard Webhooks asks for secrets of 24 bytes or more: New and Verify
// refuse shorter ones, naming the minimum.
func TestSecretAtLeast24Bytes(t *testing.T) {
	for _, n := range []int{16, 23} {
		_, err := webhook.New(webhook.Config{URL: "https://h/x", Secret: secretOf(n)})
		if !errors.Is(err, webhook.ErrSecret) || !strings.Contains(err.Error(), "fewer than 24") {
			t.Errorf("New with a %d-byte secret: %v, want ErrSecret naming 24", n, err)
		}
		if err := webhook.Verify(secretOf(n), http.Header{}, nil, 0); !errors.Is(err, webhook.ErrSecret) {
			t.Errorf("Verify with a %d-byte secret: %v, want ErrSecret", n, err)
		}
	}
	if _, err := webhook.New(webhook.Config{URL: "https://h/x", Secret: secretOf(24)}); err != nil {
		t.Errorf("New with a 24-byte secret: %v", err)
	}
	if webhook.MinSecretBytes != 24 {
		t.Errorf("MinSecretBytes = %d, want 24", webhook.MinSecretBytes)
	}
}

// With FollowRedirects, a redirect to another origin (scheme, host, port)
// is not followed: the signature and Config.Header's credentials never
// reach another host; the event is dead, the error names the Location.
// A redirect within the origin is still followed.
func TestRedirectToAnotherHostNotFollowed(t *testing.T) {
	secret := webhook.NewSecret()
	var mu sync.Mutex
	var leaked []http.Header
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		leaked = append(leaked, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer other.Close()
	rcv := newReceiver(t, secret)
	mux := rcv.srv.Config.Handler.(*http.ServeMux)
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/stolen", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/near", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/hook", http.StatusPermanentRedirect)
	})
	for _, client := range []*http.Client{nil, {}} {
		pub := newPublisher(t, webhook.Config{URL: rcv.srv.URL + "/away", Secret: secret, FollowRedirects: true, Client: client,
			Header: http.Header{"X-Api-Key": {"config-key"}}})
		ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`)}}
		err := pub.Send(context.Background(), &ev)
		var se *webhook.StatusError
		if outbox.DefaultClassifier(err) != outbox.DecisionDead || !errors.As(err, &se) || se.StatusCode != http.StatusTemporaryRedirect ||
			!strings.Contains(err.Error(), other.URL+"/stolen") || !strings.Contains(err.Error(), "another origin") {
			t.Fatalf("cross-origin redirect: %v, want a permanent StatusError naming the Location and the reason", err)
		}
		mu.Lock()
		n := len(leaked)
		mu.Unlock()
		if n != 0 {
			t.Fatalf("the other host got %d requests, with headers %v", n, leaked)
		}

		near := newPublisher(t, webhook.Config{URL: rcv.srv.URL + "/near", Secret: secret, FollowRedirects: true, Client: client})
		if err := near.Send(context.Background(), &ev); err != nil {
			t.Fatalf("same-origin redirect: %v", err)
		}
		if ps := rcv.PostsOf(ev.ID); len(ps) != 1 || ps[0].VerifyErr != nil {
			t.Fatalf("same-origin redirect: posts %+v", ps)
		}
	}
	_ = time.Second
}
