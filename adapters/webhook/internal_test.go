package webhook

import (
	"errors"
	"net/http"
	"testing"
	"time"
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
