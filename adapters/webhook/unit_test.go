package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/adapters/webhook"
	"github.com/txoutbox/txoutbox/outbox"
)

func TestNewValidates(t *testing.T) {
	secret := webhook.NewSecret()
	for _, c := range []struct {
		name string
		cfg  webhook.Config
		want string
	}{
		{"relative URL", webhook.Config{URL: "/hook", Secret: secret}, "absolute"},
		{"no host", webhook.Config{URL: "http:///hook", Secret: secret}, "absolute"},
		{"ftp", webhook.Config{URL: "ftp://h/x", Secret: secret}, "http or https"},
		{"opaque", webhook.Config{URL: "http:h", Secret: secret}, "absolute"},
		{"not a URL", webhook.Config{URL: "http://h/%zz", Secret: secret}, "not a URL"},
		{"no secret", webhook.Config{URL: "https://h/x"}, "Secret is required"},
		{"bad base64", webhook.Config{URL: "https://h/x", Secret: "whsec_not base64!"}, "invalid secret"},
		{"short key", webhook.Config{URL: "https://h/x", Secret: "whsec_c2hvcnQ="}, "fewer than"},
		{"bad rotation secret", webhook.Config{URL: "https://h/x", Secret: secret, Secrets: []string{"x"}}, "Secrets[0]"},
		{"negative", webhook.Config{URL: "https://h/x", Secret: secret, MaxBodyBytes: -1}, "negative"},
		{"bad header", webhook.Config{URL: "https://h/x", Secret: secret, Header: http.Header{"A b": {"1"}}}, "header name"},
	} {
		_, err := webhook.New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if err != nil && c.cfg.Secret != "" && strings.Contains(err.Error(), strings.TrimPrefix(c.cfg.Secret, "whsec_")) {
			t.Errorf("%s: the error shows the secret", c.name)
		}
	}
	p, err := webhook.New(webhook.Config{URL: "https://hooks.example.com/a?b=c", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// Every answer maps to the outcome the engine expects; the response body
// never reaches the error.
func TestStatusOutcomes(t *testing.T) {
	type kind string
	const (
		done, retry, dead, unavailable kind = "done", "retry", "dead", "unavailable"
	)
	cases := []struct {
		code       int
		header     http.Header
		want       kind
		retryAfter time.Duration
	}{
		{200, nil, done, 0}, {201, nil, done, 0}, {202, nil, done, 0}, {204, nil, done, 0},
		{400, nil, dead, 0}, {401, nil, dead, 0}, {403, nil, dead, 0}, {404, nil, dead, 0},
		{410, nil, dead, 0}, {413, nil, dead, 0}, {422, nil, dead, 0},
		{301, http.Header{"Location": {"https://x/y"}}, dead, 0}, {308, nil, dead, 0},
		{408, nil, retry, 0}, {500, nil, retry, 0}, {501, nil, retry, 0},
		{429, nil, unavailable, 0}, {429, http.Header{"Retry-After": {"3"}}, unavailable, 3 * time.Second},
		{503, http.Header{"Retry-After": {"120"}}, unavailable, 2 * time.Minute},
		{502, nil, unavailable, 0}, {504, nil, unavailable, 0},
	}
	secret := webhook.NewSecret()
	var next int
	var nextHeader http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range nextHeader {
			w.Header()[k] = v
		}
		w.WriteHeader(next)
		fmt.Fprint(w, "RESPONSE-BODY")
	}))
	defer srv.Close()
	pub := newPublisher(t, webhook.Config{URL: srv.URL + "/hook/TOKEN?key=SECRETQUERY", Secret: secret})
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`)}}
	for _, c := range cases {
		next, nextHeader = c.code, c.header
		err := pub.Send(context.Background(), &ev)
		down, ra := outbox.IsUnavailable(err)
		var got kind
		switch {
		case err == nil:
			got = done
		case down:
			got = unavailable
		case outbox.DefaultClassifier(err) == outbox.DecisionDead:
			got = dead
		default:
			got = retry
		}
		if got != c.want || ra != c.retryAfter {
			t.Errorf("%d %v: %s (retry after %s), want %s (%s): %v", c.code, c.header, got, ra, c.want, c.retryAfter, err)
		}
		if err == nil {
			continue
		}
		for _, leak := range []string{"RESPONSE-BODY", "TOKEN", "SECRETQUERY"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("%d: the error %q shows %s", c.code, err, leak)
			}
		}
		var se *webhook.StatusError
		if !errors.As(err, &se) || se.StatusCode != c.code {
			t.Errorf("%d: %v is not a *StatusError with the code", c.code, err)
		}
		if c.code == 301 && !strings.Contains(err.Error(), "https://x/y") {
			t.Errorf("301: %q does not name the Location", err)
		}
	}
}

// Connection refused and a receiver that does not answer in time are
// outages, not faults of the event.
func TestUnreachableIsUnavailable(t *testing.T) {
	secret := webhook.NewSecret()
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`)}}

	gone := httptest.NewServer(http.NotFoundHandler())
	url := gone.URL + "/hook?token=SECRETQUERY"
	gone.Close()
	err := newPublisher(t, webhook.Config{URL: url, Secret: secret}).Send(context.Background(), &ev)
	if down, _ := outbox.IsUnavailable(err); !down || strings.Contains(err.Error(), "SECRETQUERY") {
		t.Fatalf("refused: %v, want unavailable without the query", err)
	}

	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	start := time.Now()
	err = newPublisher(t, webhook.Config{URL: slow.URL, Secret: secret, Timeout: 100 * time.Millisecond}).Send(context.Background(), &ev)
	if down, _ := outbox.IsUnavailable(err); !down || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("slow: %v, want unavailable naming the timeout", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the timeout took %s", took)
	}
}

// Event headers cannot forge the signature headers nor reach the
// connection; Config.Header wins over them; a header the transport would
// refuse makes the event dead instead of failing forever.
func TestHeaders(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	pub := newPublisher(t, webhook.Config{URL: rcv.URL(), Secret: secret,
		Header: http.Header{"Authorization": {"Bearer config"}}, UserAgent: "test-agent"})
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{}`), Headers: map[string]string{
		"webhook-id": "forged", "webhook-signature": "v1,forged", "authorization": "Bearer event",
		"connection": "close", "host": "evil.example", "x-kept": "yes",
	}}}
	if err := pub.Send(context.Background(), &ev); err != nil {
		t.Fatal(err)
	}
	p := rcv.Posts()[0]
	if p.VerifyErr != nil || p.ID != ev.ID {
		t.Fatalf("id %q verify %v", p.ID, p.VerifyErr)
	}
	for k, want := range map[string]string{"Authorization": "Bearer config", "X-Kept": "yes", "User-Agent": "test-agent"} {
		if got := p.Header.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}

	ev.Headers = map[string]string{"x-bad": "a\x01b"}
	err := pub.Send(context.Background(), &ev)
	if outbox.DefaultClassifier(err) != outbox.DecisionDead || strings.Contains(err.Error(), "a\x01b") {
		t.Fatalf("control character: %v, want permanent, without the value", err)
	}
}

// With FollowRedirects, a 307 is followed with the same signed body; a
// Config.Client is used (as a copy: its own CheckRedirect is left alone).
func TestFollowRedirects(t *testing.T) {
	secret := webhook.NewSecret()
	rcv := newReceiver(t, secret)
	mux := rcv.srv.Config.Handler.(*http.ServeMux)
	mux.HandleFunc("/old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/hook", http.StatusTemporaryRedirect)
	})
	client := &http.Client{}
	pub := newPublisher(t, webhook.Config{URL: rcv.srv.URL + "/old", Secret: secret, Client: client, FollowRedirects: true})
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "t", JSON: []byte(`{"a":1}`)}}
	if err := pub.Send(context.Background(), &ev); err != nil {
		t.Fatal(err)
	}
	ps := rcv.PostsOf(ev.ID)
	if len(ps) != 1 || ps[0].VerifyErr != nil || string(ps[0].Body) != `{"a":1}` {
		t.Fatalf("posts %+v", ps)
	}
	if client.CheckRedirect != nil {
		t.Fatal("New changed the caller's client")
	}
}
