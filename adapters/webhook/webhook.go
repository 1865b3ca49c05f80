// Package webhook delivers outbox events to an HTTP endpoint: one POST
// per event, signed the Standard Webhooks way
// (https://www.standardwebhooks.com), so that any receiver with a
// Standard Webhooks library, or this package's Verify, can check it.
//
//	pub, err := webhook.New(webhook.Config{URL: "https://hooks.example.com/orders", Secret: secret})
//	err = ob.Subscribe(outbox.Subscription{Name: "orders-webhook", Handler: pub.Handler()})
//
// Each request carries:
//
//   - webhook-id: the event id (the same on every redelivery: receivers
//     de-duplicate on it), percent-encoded if it holds a ".", a "%", a
//     space or non-ASCII bytes, so that the signed content parses one way
//     only; webhook-timestamp (unix seconds) and webhook-signature:
//     "v1," + base64(HMAC-SHA256(key, id + "." + timestamp + "." +
//     body)) for each configured secret, space separated, so that
//     secrets can be rotated;
//   - the event's metadata as headers, named as on every other broker
//     (txoutbox-id, txoutbox-type, …, traceparent; the table is in
//     adapters/README.md), and Content-Type from it; never an event's
//     Authorization or Cookie (unless Config.ForwardHeaders names it),
//     Proxy-Authorization, hop-by-hop headers, Host or Expect;
//   - the payload as the body, byte for byte.
//
// # Outcomes
//
// A 2xx answer delivers the event. 408, 500 and the other 5xx retry with
// the subscription's back-off, spending attempts. 429, 502, 503 and 504,
// connection errors and timeouts mean the endpoint is unavailable
// (outbox.Unavailable): no attempt is spent, the subscription's circuit
// opens after a few in a row, and a Retry-After answer (seconds or an HTTP
// date) is honoured. Other 3xx and 4xx answers (410 Gone among them) are
// permanent (outbox.Permanent): the event is dead at once, and the error
// (a *StatusError) names the status, and the Location of a redirect,
// which is never followed unless Config.FollowRedirects is set, and then
// only within the origin of Config.URL.
//
// Response bodies are never logged nor put into errors: the connector
// reads at most a few kilobytes of them, to reuse the connection, and
// discards them. Errors name the endpoint by its scheme and host only, so
// that tokens in its path or query do not reach logs or the outbox table.
package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Defaults for Config.
const (
	DefaultTimeout          = 15 * time.Second
	DefaultMaxRetryAfter    = 10 * time.Minute
	DefaultBatchConcurrency = 8
	DefaultUserAgent        = "txoutbox-webhook/1"
)

// drainLimit is the most bytes of a response body read (and discarded)
// so that the connection can be reused.
const drainLimit = 4 << 10

// Config configures a Publisher. URL and Secret are required.
type Config struct {
	// URL is the endpoint every event is posted to: an absolute http or
	// https URL. It comes from configuration only, never from event data.
	URL string
	// Secret signs every request: "whsec_" followed by the standard
	// base64 of at least MinSecretBytes random bytes, as Standard
	// Webhooks senders hand them out (see NewSecret).
	Secret string
	// Secrets are more secrets that sign every request as well, for a
	// rotation: the webhook-signature header then lists one signature
	// per secret (Secret's first), and a receiver that knows any of them
	// accepts the request.
	Secrets []string
	// Timeout bounds each request, from connecting to the end of the
	// answer's headers; a timeout counts as the endpoint being
	// unavailable. Defaults to 15s, within the 15–30 s Standard Webhooks
	// suggests. The subscription's Timeout bounds it too (a request cut by
	// it is unavailable as well): the engine's default
	// (outbox.DefaultListenerTimeout, 10s) is shorter, so give the
	// subscription a Timeout above this one (20s for the default) for the
	// endpoint to get the whole 15 s.
	Timeout time.Duration
	// Client sends the requests. Defaults to a client of its own with a
	// connection pool sized for concurrent deliveries to one host. The
	// Publisher uses a copy whose CheckRedirect refuses redirects, unless
	// FollowRedirects is set.
	Client *http.Client
	// FollowRedirects lets the client follow redirects within the
	// origin of URL (its scheme, host and port), then with its own
	// CheckRedirect, or Go's default of ten. A redirect to another origin
	// is never followed, so that the signature and Header's credentials
	// reach no other host: like every 3xx answer when FollowRedirects is
	// off, it is a permanent error naming its Location.
	FollowRedirects bool
	// MaxBodyBytes refuses events whose payload is longer, as a permanent
	// error (the event is dead at once, the request is never sent): set it
	// to what the receiver accepts. 0 means no limit.
	MaxBodyBytes int
	// MaxRetryAfter caps the wait a Retry-After answer asks for.
	// Defaults to 10 minutes.
	MaxRetryAfter time.Duration
	// Header is added to every request (an Authorization header, say).
	// It wins over the event's headers of the same name; it cannot
	// replace the webhook-* headers nor Content-Type.
	Header http.Header
	// UserAgent is the User-Agent header. Defaults to "txoutbox-webhook/1".
	UserAgent string
	// BatchConcurrency bounds the requests one BatchHandler call sends at
	// once. Defaults to 8.
	BatchConcurrency int
	// ForwardHeaders names the credential headers (Authorization,
	// Cookie) that are forwarded when an event carries them. By default
	// they are dropped: an event's headers come from business code and
	// whatever it copied from its own requests, and must not become
	// credentials at the receiver. Proxy-Authorization, the hop-by-hop
	// headers (Connection, Keep-Alive, TE, Trailer, Upgrade, …), Expect,
	// Host and the headers this connector sets are never forwarded; New
	// refuses them here. Defaults to none.
	ForwardHeaders []string
}

// Publisher posts events to one endpoint. It is safe for concurrent use;
// its handlers may run on many goroutines at once (the subscription's
// Concurrency).
type Publisher struct {
	u       *url.URL
	url     string
	origin  string // scheme://host, for errors
	keys    [][]byte
	client  *http.Client
	owned   *http.Transport // the default client's transport, closed by Close
	timeout time.Duration
	maxBody int
	maxRA   time.Duration
	header  http.Header
	forward map[string]bool // credential headers an event may set
	follow  bool
	ua      string
	batchN  int
	now     func() time.Time
}

// New checks cfg and returns a Publisher. It fails on a URL that is not
// an absolute http or https URL and on a missing or malformed secret.
func New(cfg Config) (*Publisher, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, errors.New("webhook: Config.URL is not a URL")
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return nil, fmt.Errorf("webhook: Config.URL must be an absolute http or https URL with a host (got scheme %q, host %q)", u.Scheme, u.Host)
	}
	if cfg.Secret == "" {
		return nil, fmt.Errorf("webhook: Config.Secret is required (%s + base64; see NewSecret)", SecretPrefix)
	}
	var keys [][]byte
	for i, s := range append([]string{cfg.Secret}, cfg.Secrets...) {
		k, err := decodeSecret(s)
		if err != nil {
			if i == 0 {
				return nil, fmt.Errorf("webhook: Config.Secret: %w", err)
			}
			return nil, fmt.Errorf("webhook: Config.Secrets[%d]: %w", i-1, err)
		}
		keys = append(keys, k)
	}
	if cfg.MaxBodyBytes < 0 || cfg.BatchConcurrency < 0 || cfg.Timeout < 0 || cfg.MaxRetryAfter < 0 {
		return nil, errors.New("webhook: Config.Timeout, MaxBodyBytes, MaxRetryAfter and BatchConcurrency must not be negative")
	}
	for k, vs := range cfg.Header {
		if !validHeaderName(k) {
			return nil, fmt.Errorf("webhook: Config.Header: %q is not a valid header name", k)
		}
		for _, v := range vs {
			if !validHeaderValue(v) {
				return nil, fmt.Errorf("webhook: Config.Header: the value of %q contains control characters", k)
			}
		}
	}
	forward, err := forwardSet(cfg.ForwardHeaders)
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		u:       u,
		forward: forward,
		follow:  cfg.FollowRedirects,
		url:     u.String(),
		origin:  u.Scheme + "://" + u.Host,
		keys:    keys,
		timeout: or(cfg.Timeout, DefaultTimeout),
		maxBody: cfg.MaxBodyBytes,
		maxRA:   or(cfg.MaxRetryAfter, DefaultMaxRetryAfter),
		header:  cfg.Header.Clone(),
		ua:      or(cfg.UserAgent, DefaultUserAgent),
		batchN:  or(cfg.BatchConcurrency, DefaultBatchConcurrency),
		now:     time.Now,
	}
	var c http.Client
	if cfg.Client != nil {
		c = *cfg.Client
	} else {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		c.Transport, p.owned = t, t
	}
	c.CheckRedirect = p.checkRedirect(c.CheckRedirect)
	p.client = &c
	return p, nil
}

// forwardSet checks Config.ForwardHeaders.
func forwardSet(names []string) (map[string]bool, error) {
	set := map[string]bool{}
	for _, n := range names {
		k := http.CanonicalHeaderKey(n)
		switch {
		case !validHeaderName(n):
			return nil, fmt.Errorf("webhook: Config.ForwardHeaders: %q is not a valid header name", n)
		case never[k]:
			return nil, fmt.Errorf("webhook: Config.ForwardHeaders: %s is never forwarded (it belongs to the connection or to this connector); remove it", k)
		case !credential[k]:
			return nil, fmt.Errorf("webhook: Config.ForwardHeaders: %s is forwarded anyway; list only %s", k, "Authorization or Cookie")
		}
		set[k] = true
	}
	return set, nil
}

// checkRedirect returns the client's redirect policy: none without
// FollowRedirects; else within the origin of Config.URL only, then next's
// (or Go's default of ten).
func (p *Publisher) checkRedirect(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if !p.follow || !sameOrigin(p.u, req.URL) {
			return http.ErrUseLastResponse // outcome makes the 3xx a permanent error
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// sameOrigin reports whether a and b have the same scheme, host and port.
func sameOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		if strings.EqualFold(u.Scheme, "https") {
			return "443"
		}
		return "80"
	}
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func or[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// Close closes the idle connections of the Publisher's own client (not
// those of a Config.Client). The Publisher starts no goroutines: every
// request has returned when its handler call has.
func (p *Publisher) Close() error {
	if p.owned != nil {
		p.owned.CloseIdleConnections()
	}
	return nil
}

// Handler returns the subscription handler: one signed POST per event.
// Use it as outbox.Subscription.Handler; the subscription's Concurrency
// bounds the requests in flight.
func (p *Publisher) Handler() outbox.Handler {
	return func(ctx context.Context, ev outbox.Event) error { return p.Send(ctx, &ev) }
}

// BatchHandler returns a batch subscription handler: it posts the events
// of a batch concurrently (up to Config.BatchConcurrency at once), one
// request each, and reports an outcome per event (an
// *outbox.BatchError when some failed). Standard Webhooks has no batch
// request; this only lets one subscription call put more requests in
// flight.
func (p *Publisher) BatchHandler() outbox.BatchHandler {
	return func(ctx context.Context, evs []outbox.Event) error {
		errs := make([]error, len(evs))
		sem := make(chan struct{}, p.batchN)
		var wg sync.WaitGroup
		for i := range evs {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				errs[i] = p.Send(ctx, &evs[i])
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return &outbox.BatchError{Errs: errs}
			}
		}
		return nil
	}
}

// StatusError is the error of a request the endpoint answered with a
// status other than 2xx. It never holds the response body.
type StatusError struct {
	// Endpoint is the URL's scheme and host.
	Endpoint string
	// StatusCode is the answer's status code.
	StatusCode int
	// Location is the Location header of a 3xx answer.
	Location string
	// RetryAfter is the wait a 429 or 503 answer asked for, capped by
	// Config.MaxRetryAfter (0 if it did not say).
	RetryAfter time.Duration
	// CrossOrigin reports a redirect not followed, with
	// Config.FollowRedirects, because its Location is on another origin.
	CrossOrigin bool
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("webhook: POST %s: %d %s", e.Endpoint, e.StatusCode, http.StatusText(e.StatusCode))
	switch {
	case e.StatusCode >= 300 && e.StatusCode < 400:
		loc := e.Location
		if loc == "" {
			loc = "(none)"
		}
		s += ": redirect to " + loc + " not followed"
		if e.CrossOrigin {
			s += " (another origin: redirects are followed within the scheme, host and port of Config.URL only; point Config.URL at the new address)"
		}
	case e.RetryAfter > 0:
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return s
}

// Send posts one event and returns its outcome as the engine expects it:
// nil, an outbox.Unavailable error, an outbox.Permanent error, or a plain
// error (retry). Handler and BatchHandler call it.
func (p *Publisher) Send(ctx context.Context, ev *outbox.Event) error {
	body := ev.Payload()
	if p.maxBody > 0 && len(body) > p.maxBody {
		return outbox.Permanent(fmt.Errorf("webhook: event %s: payload of %d bytes is over MaxBodyBytes (%d): not sent", ev.ID, len(body), p.maxBody))
	}
	if ev.ID == "" {
		return outbox.Permanent(errors.New("webhook: event without an id"))
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return outbox.Permanent(fmt.Errorf("webhook: POST %s: %v", p.origin, err))
	}
	if err := p.setHeaders(req.Header, ev, body); err != nil {
		return outbox.Permanent(err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text holds the whole URL
		}
		e := fmt.Errorf("webhook: POST %s: %w", p.origin, err)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			e = fmt.Errorf("webhook: POST %s: no answer within the timeout: %w", p.origin, err)
		}
		// Connection refused or reset, DNS, TLS, timeouts: the endpoint,
		// not the event, is at fault.
		return outbox.Unavailable(e, 0)
	}
	io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
	return p.outcome(resp)
}

func (p *Publisher) outcome(resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	se := &StatusError{Endpoint: p.origin, StatusCode: code}
	switch {
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable:
		se.RetryAfter = p.retryAfter(resp.Header.Get("Retry-After"))
		return outbox.Unavailable(se, se.RetryAfter)
	case code == http.StatusBadGateway, code == http.StatusGatewayTimeout:
		return outbox.Unavailable(se, 0)
	case code == http.StatusRequestTimeout, code >= 500:
		return se // retry, spending an attempt
	case code >= 300 && code < 400:
		se.Location = resp.Header.Get("Location")
		if loc, err := resp.Location(); err == nil && p.follow {
			se.CrossOrigin = !sameOrigin(p.u, loc)
		}
		return outbox.Permanent(se)
	}
	return outbox.Permanent(se) // 1xx (never final), 4xx: the endpoint refuses this event
}

// retryAfter parses a Retry-After value: seconds or an HTTP date.
func (p *Publisher) retryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0
		}
		if n > int64(p.maxRA/time.Second) {
			return p.maxRA
		}
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(p.now())
	}
	return max(0, min(d, p.maxRA))
}

// never are headers an event cannot set: they belong to the connection
// (hop-by-hop, Host, framing, Expect), to a proxy, or to this connector.
var never = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authorization": true, "Proxy-Authenticate": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Expect": true, "Content-Type": true, "User-Agent": true,
	http.CanonicalHeaderKey(HeaderID): true, http.CanonicalHeaderKey(HeaderTimestamp): true,
	http.CanonicalHeaderKey(HeaderSignature): true,
}

// credential are headers an event sets only when Config.ForwardHeaders
// names them.
var credential = map[string]bool{"Authorization": true, "Cookie": true}

func (p *Publisher) setHeaders(h http.Header, ev *outbox.Event, body []byte) error {
	for _, m := range meta.Headers(ev) {
		k := http.CanonicalHeaderKey(m.Key)
		if m.Key == meta.ContentType {
			h.Set("Content-Type", m.Value)
			continue
		}
		if never[k] || (credential[k] && !p.forward[k]) {
			continue
		}
		if !validHeaderName(m.Key) {
			return fmt.Errorf("webhook: event %s: header name %q is not a valid HTTP header name", ev.ID, m.Key)
		}
		if !validHeaderValue(m.Value) {
			return fmt.Errorf("webhook: event %s: the value of header %q contains control characters", ev.ID, m.Key)
		}
		h.Set(k, m.Value)
	}
	for k, vs := range p.header {
		if never[http.CanonicalHeaderKey(k)] {
			continue
		}
		h[http.CanonicalHeaderKey(k)] = vs
	}
	h.Set("User-Agent", p.ua)
	ts := strconv.FormatInt(p.now().Unix(), 10)
	id := webhookID(ev.ID)
	sigs := make([]string, len(p.keys))
	for i, k := range p.keys {
		sigs[i] = sign(k, id, ts, body)
	}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, strings.Join(sigs, " "))
	return nil
}

// validHeaderName reports whether s is an HTTP token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s has no control characters other
// than horizontal tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// webhookID returns the webhook-id of an event id: the id itself, unless
// it holds a ".", which would make the signed content id.timestamp.body
// parse more than one way, a "%", a space or a byte outside printable
// ASCII (which receivers may trim or mangle in a header); those bytes are
// then percent-encoded ("a.b" goes as "a%2Eb"). Distinct ids keep
// distinct webhook-ids, and every redelivery of an event has the same.
func webhookID(id string) string {
	clean := true
	for i := 0; i < len(id) && clean; i++ {
		clean = !needsEscape(id[i])
	}
	if clean {
		return id
	}
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		if c := id[i]; needsEscape(c) {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func needsEscape(c byte) bool { return c == '.' || c == '%' || c <= ' ' || c >= 0x7f }
