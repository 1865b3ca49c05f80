package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks headers every request carries.
const (
	HeaderID        = "webhook-id"        // the event id: receivers de-duplicate on it
	HeaderTimestamp = "webhook-timestamp" // when the request was signed, in unix seconds
	HeaderSignature = "webhook-signature" // "v1,<base64>" per secret, space separated
)

// SecretPrefix starts a secret in the Standard Webhooks form:
// "whsec_" followed by the base64 (standard alphabet) of the key bytes.
const SecretPrefix = "whsec_"

// MinSecretBytes is the shortest key New and Verify accept: 24 bytes, as
// Standard Webhooks asks.
const MinSecretBytes = 24

// DefaultTolerance is the tolerance Verify uses when given 0: how far the
// signed timestamp may be from the receiver's clock, either way.
const DefaultTolerance = 5 * time.Minute

// Errors returned by Verify (wrapped with details); match them with
// errors.Is.
var (
	// ErrMissingHeaders: a webhook-id, webhook-timestamp or
	// webhook-signature header is missing.
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature header")
	// ErrTimestamp: the timestamp is not a number of seconds or is outside
	// the tolerance (a replay, or a clock far off).
	ErrTimestamp = errors.New("webhook: timestamp outside the tolerance")
	// ErrSignature: no signature in the header matches the secret.
	ErrSignature = errors.New("webhook: no matching signature")
	// ErrSecret: the secret is not "whsec_" + base64 of at least
	// MinSecretBytes bytes.
	ErrSecret = errors.New("webhook: invalid secret")
)

// NewSecret returns a new random secret in the Standard Webhooks form
// ("whsec_" + base64 of 32 random bytes), for a receiver to hand out.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// decodeSecret returns the key bytes of a secret. The "whsec_" prefix is
// optional, as in the Standard Webhooks libraries.
func decodeSecret(secret string) ([]byte, error) {
	s := strings.TrimPrefix(secret, SecretPrefix)
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		// Never echo the secret.
		return nil, fmt.Errorf("%w: not %s followed by standard base64", ErrSecret, SecretPrefix)
	}
	if len(key) < MinSecretBytes {
		return nil, fmt.Errorf("%w: %d key bytes, fewer than %d", ErrSecret, len(key), MinSecretBytes)
	}
	return key, nil
}

// sign returns "v1," + base64(HMAC-SHA256(key, id.timestamp.body)).
func sign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Sign returns the webhook-signature value of one secret for a message:
// "v1," + base64(HMAC-SHA256(key, id + "." + unix seconds + "." + body)).
// id is the webhook-id header's value: the connector sends an event id
// that holds a "." (or "%", a space, non-ASCII) percent-encoded, so that
// the signed content parses one way only. The connector signs with every
// secret; Sign is exported for receivers' tests and for tools that replay
// a request by hand.
func Sign(secret, id string, timestamp time.Time, body []byte) (string, error) {
	key, err := decodeSecret(secret)
	if err != nil {
		return "", err
	}
	return sign(key, id, strconv.FormatInt(timestamp.Unix(), 10), body), nil
}

// Verify checks a request received from this connector (or any Standard
// Webhooks sender): that the webhook-timestamp is within tolerance of
// now, either way (0 means DefaultTolerance), and that one of the v1
// signatures of the webhook-signature header is the HMAC-SHA256 of
// webhook-id, timestamp and body under secret, compared in constant time.
// body must be the raw request body, byte for byte, read before any
// decoding.
//
// A nil error means the request is authentic; the receiver should still
// de-duplicate on the webhook-id header (delivery is at least once). To
// accept two secrets during a rotation, call Verify with each.
func Verify(secret string, header http.Header, body []byte, tolerance time.Duration) error {
	return verifyAt(secret, header, body, tolerance, time.Now())
}

func verifyAt(secret string, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	key, err := decodeSecret(secret)
	if err != nil {
		return err
	}
	id, ts, sigs := header.Get(HeaderID), header.Get(HeaderTimestamp), header.Values(HeaderSignature)
	if id == "" || ts == "" || len(sigs) == 0 {
		return ErrMissingHeaders
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not unix seconds", ErrTimestamp, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed %s from now, tolerance %s", ErrTimestamp, d.Round(time.Second), tolerance)
	}
	want := []byte(sign(key, id, ts, body))
	for _, v := range sigs {
		for _, sig := range strings.Fields(v) {
			if strings.HasPrefix(sig, "v1,") && hmac.Equal([]byte(sig), want) {
				return nil
			}
		}
	}
	return ErrSignature
}
