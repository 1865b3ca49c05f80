package webhook

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/inbox"
)

// DefaultMaxReceiveBytes is the largest body a Receiver reads when
// ReceiverConfig.MaxBodyBytes is 0.
const DefaultMaxReceiveBytes = 1 << 20

// ReceiverConfig configures a Receiver. Inbox, Name, Secrets and Handler
// are required.
type ReceiverConfig struct {
	// Inbox applies each request once, de-duplicating on webhook-id.
	Inbox *inbox.Inbox
	// Name is the inbox consumer name of this endpoint.
	Name string
	// Secrets are the accepted secrets ("whsec_…"); a request signed with
	// any of them is authentic (two during a rotation).
	Secrets []string
	// Tolerance is how far webhook-timestamp may be from now. Defaults to
	// DefaultTolerance.
	Tolerance time.Duration
	// MaxBodyBytes is the largest body accepted; a larger one is answered
	// 413. Defaults to DefaultMaxReceiveBytes.
	MaxBodyBytes int64
	// Handler applies a request's body; its ctx carries the transaction.
	// Message.Headers holds the request's headers (first values) but
	// Authorization, Cookie and webhook-signature.
	Handler inbox.Handler
	// DuplicateStatus answers a request whose webhook-id was applied
	// before: 200 (the default) or 409. A sender that treats 409 as a
	// refusal (this package's Publisher marks the event dead) should get
	// 200.
	DuplicateStatus int
	// Logger gets a line per refused or failed request, never bodies.
	// Defaults to slog.Default(). Metrics: inbox.Config.Observe.
	Logger *slog.Logger
}

// Receiver is the http.Handler of a webhook endpoint with an inbox: it
// verifies the Standard Webhooks signature, applies the body once per
// webhook-id through inbox.Handle, and answers 2xx only after the commit.
//
//	200 applied, or parked after inbox MaxAttempts failures (the sender
//	    should stop); duplicates: DuplicateStatus (200)
//	400 missing webhook headers, or an id the inbox refuses
//	401 bad signature or timestamp out of tolerance
//	405 not a POST
//	413 body over MaxBodyBytes
//	500 the handler failed (or the database): the sender retries
//
// Mount it under an http.Server whose Shutdown lets in-flight requests
// finish: a request cut short rolls back and the sender retries it.
type Receiver struct {
	cfg ReceiverConfig
	log *slog.Logger
}

// NewReceiver checks cfg and returns a Receiver.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	switch {
	case cfg.Inbox == nil:
		return nil, errors.New("webhook: ReceiverConfig.Inbox is nil: create one with inbox.New")
	case cfg.Name == "":
		return nil, errors.New("webhook: ReceiverConfig.Name is empty: name the endpoint for the inbox's de-duplication")
	case cfg.Handler == nil:
		return nil, errors.New("webhook: ReceiverConfig.Handler is nil")
	case len(cfg.Secrets) == 0:
		return nil, errors.New("webhook: ReceiverConfig.Secrets is empty: a receiver must verify signatures")
	case cfg.DuplicateStatus != 0 && cfg.DuplicateStatus != http.StatusOK && cfg.DuplicateStatus != http.StatusConflict:
		return nil, fmt.Errorf("webhook: ReceiverConfig.DuplicateStatus %d: use 200 or 409", cfg.DuplicateStatus)
	case cfg.MaxBodyBytes < 0 || cfg.Tolerance < 0:
		return nil, errors.New("webhook: ReceiverConfig.MaxBodyBytes and Tolerance must not be negative; 0 means the default")
	}
	for i, s := range cfg.Secrets {
		if _, err := decodeSecret(s); err != nil {
			return nil, fmt.Errorf("webhook: ReceiverConfig.Secrets[%d]: %w", i, err)
		}
	}
	cfg.DuplicateStatus = cmp.Or(cfg.DuplicateStatus, http.StatusOK)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxReceiveBytes)
	return &Receiver{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default())}, nil
}

// ServeHTTP implements http.Handler.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, rc.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			rc.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", rc.cfg.MaxBodyBytes))
			return
		}
		rc.refuse(w, r, http.StatusBadRequest, fmt.Errorf("read body: %w", err))
		return
	}
	if status, err := rc.verify(r.Header, body); err != nil {
		rc.refuse(w, r, status, err)
		return
	}
	m := inbox.Message{ID: r.Header.Get(HeaderID), Payload: body, Headers: keptHeaders(r.Header)}
	res, err := rc.cfg.Inbox.Handle(r.Context(), rc.cfg.Name, m, rc.cfg.Handler)
	switch res {
	case inbox.Applied, inbox.Parked:
		w.WriteHeader(http.StatusOK)
	case inbox.Duplicate:
		w.WriteHeader(rc.cfg.DuplicateStatus)
	case inbox.Rejected:
		status := http.StatusBadRequest
		if errors.Is(err, inbox.ErrTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		rc.refuse(w, r, status, err)
	default:
		rc.log.Warn("webhook: request failed; the sender retries it", slog.String("consumer", rc.cfg.Name), slog.String("webhook_id", m.ID), slog.Any("error", err))
		http.Error(w, "not applied; retry", http.StatusInternalServerError)
	}
}

// verify checks the signature against each secret: 400 without the
// headers, 401 for a bad signature or timestamp.
func (rc *Receiver) verify(h http.Header, body []byte) (int, error) {
	var err error
	for _, s := range rc.cfg.Secrets {
		if err = Verify(s, h, body, rc.cfg.Tolerance); err == nil {
			return 0, nil
		}
		if errors.Is(err, ErrMissingHeaders) {
			return http.StatusBadRequest, err
		}
	}
	return http.StatusUnauthorized, err
}

func (rc *Receiver) refuse(w http.ResponseWriter, r *http.Request, status int, err error) {
	rc.log.Warn("webhook: request refused", slog.String("consumer", rc.cfg.Name), slog.String("webhook_id", r.Header.Get(HeaderID)),
		slog.Int("status", status), slog.Any("error", err))
	http.Error(w, http.StatusText(status), status)
}

// keptHeaders returns the first value of each header but credentials
// and the signature.
func keptHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		switch strings.ToLower(k) {
		case "authorization", "cookie", "proxy-authorization", HeaderSignature:
			continue
		}
		if len(v) > 0 {
			out[strings.ToLower(k)] = v[0]
		}
	}
	return out
}
