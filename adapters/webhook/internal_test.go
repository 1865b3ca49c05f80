package webhook

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// The Standard Webhooks reference vector: a receiver's existing library
// must accept what this package signs.
func TestStandardWebhooksVector(t *testing.T) {
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	ts := time.Unix(1614265330, 0)
	body := []byte(`{"test": 2432232314}`)
	got, err := Sign(secret, id, ts, body)
	if err != nil || got != want {
		t.Fatalf("Sign = %q, %v; want %q", got, err, want)
	}
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, "1614265330")
	h.Set(HeaderSignature, "v1,bm9wZQ== "+want) // another secret's signature first
	if err := verifyAt(secret, h, body, 0, ts.Add(time.Minute)); err != nil {
		t.Fatalf("verify: %v", err)
	}
	// Without the prefix, as the reference libraries accept it.
	if err := verifyAt(secret[len(SecretPrefix):], h, body, 0, ts); err != nil {
		t.Fatalf("verify without prefix: %v", err)
	}
	cases := []struct {
		name   string
		mutate func(h http.Header, body []byte) []byte
		now    time.Time
		want   error
	}{
		{"tampered body", func(h http.Header, b []byte) []byte { return append(b, ' ') }, ts, ErrSignature},
		{"other id", func(h http.Header, b []byte) []byte { h.Set(HeaderID, "msg_other"); return b }, ts, ErrSignature},
		{"other timestamp", func(h http.Header, b []byte) []byte { h.Set(HeaderTimestamp, "1614265331"); return b }, ts, ErrSignature},
		{"v2 scheme", func(h http.Header, b []byte) []byte { h.Set(HeaderSignature, "v2,"+want[3:]); return b }, ts, ErrSignature},
		{"too old", func(h http.Header, b []byte) []byte { return b }, ts.Add(6 * time.Minute), ErrTimestamp},
		{"from the future", func(h http.Header, b []byte) []byte { return b }, ts.Add(-6 * time.Minute), ErrTimestamp},
		{"bad timestamp", func(h http.Header, b []byte) []byte { h.Set(HeaderTimestamp, "soon"); return b }, ts, ErrTimestamp},
		{"no signature", func(h http.Header, b []byte) []byte { h.Del(HeaderSignature); return b }, ts, ErrMissingHeaders},
		{"no id", func(h http.Header, b []byte) []byte { h.Del(HeaderID); return b }, ts, ErrMissingHeaders},
	}
	for _, c := range cases {
		h2 := h.Clone()
		b := c.mutate(h2, append([]byte(nil), body...))
		if err := verifyAt(secret, h2, b, 0, c.now); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := verifyAt(NewSecret(), h, body, 0, ts); !errors.Is(err, ErrSignature) {
		t.Errorf("wrong secret: %v", err)
	}
	if err := verifyAt("whsec_!!", h, body, 0, ts); !errors.Is(err, ErrSecret) {
		t.Errorf("bad secret: %v", err)
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	p := &Publisher{maxRA: 10 * time.Minute, now: func() time.Time { return now }}
	for v, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"-3":                            0,
		"7":                             7 * time.Second,
		" 2 ":                           2 * time.Second,
		"99999999999":                   10 * time.Minute,
		"Mon, 23 Nov 2026 10:00:30 GMT": 30 * time.Second,
		"Mon, 23 Nov 2026 09:00:00 GMT": 0,
		"Mon, 23 Nov 2026 12:00:00 GMT": 10 * time.Minute,
		"soon":                          0,
	} {
		if got := p.retryAfter(v); got != want {
			t.Errorf("Retry-After %q: %s, want %s", v, got, want)
		}
	}
}

// An event id holding "." cannot shift the boundaries of the signed
// content id.timestamp.body: the webhook-id is encoded, so the signature
// of (id "a.100", ts 200, body X) does not verify as (id "a", ts 100,
// body "200.X"); an id without "." goes as it is.
func TestMessageIDWithDotIsEncoded(t *testing.T) {
	secret := NewSecret()
	p, err := New(Config{URL: "https://h/x", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	p.now = func() time.Time { return time.Unix(200, 0) }
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "a.100", Type: "t", Bytes: []byte("X")}}
	h := http.Header{}
	if err := p.setHeaders(h, ev, ev.Bytes); err != nil {
		t.Fatal(err)
	}
	id := h.Get(HeaderID)
	if strings.Contains(id, ".") || id == "" {
		t.Fatalf("webhook-id %q holds a dot", id)
	}
	if err := verifyAt(secret, h, []byte("X"), 0, time.Unix(200, 0)); err != nil {
		t.Fatalf("the request does not verify: %v", err)
	}
	forged := http.Header{}
	forged.Set(HeaderID, "a")
	forged.Set(HeaderTimestamp, "100")
	forged.Set(HeaderSignature, h.Get(HeaderSignature))
	if err := verifyAt(secret, forged, []byte("200.X"), time.Hour, time.Unix(200, 0)); !errors.Is(err, ErrSignature) {
		t.Fatalf("the signature of id %q verifies as id \"a\" with another body: %v", ev.ID, err)
	}
	// Distinct ids stay distinct; plain ids (ULIDs, UUIDs, "order:42") are unchanged.
	seen := map[string]string{}
	for _, in := range []string{"a.b", "a%2Eb", "a%b", "a b", "é", "01JDEF", "order:42", "4f1c-9a"} {
		out := webhookID(in)
		if prev, dup := seen[out]; dup {
			t.Errorf("ids %q and %q both encode to %q", prev, in, out)
		}
		seen[out] = in
		if strings.ContainsAny(out, ". ") {
			t.Errorf("webhookID(%q) = %q", in, out)
		}
	}
	for _, plain := range []string{"01JDEF", "order:42", "4f1c-9a"} {
		if webhookID(plain) != plain {
			t.Errorf("webhookID(%q) = %q, want it unchanged", plain, webhookID(plain))
		}
	}
}

// The default timeout is within the 15–30 s Standard Webhooks suggests.
func TestDefaultTimeout(t *testing.T) {
	p, err := New(Config{URL: "https://h/x", Secret: NewSecret()})
	if err != nil {
		t.Fatal(err)
	}
	if p.timeout < 15*time.Second || p.timeout > 30*time.Second {
		t.Fatalf("default timeout %s, want 15–30 s", p.timeout)
	}
}
