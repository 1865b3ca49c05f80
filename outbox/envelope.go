package outbox

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// EventType names a kind of event, such as "OrderPlaced". Declare the types
// of a service as constants; any non-empty printable string of at most
// MaxTypeLen bytes is allowed (no control, line-separator or
// bidirectional control characters), so dynamic types work too:
//
//	const OrderPlaced outbox.EventType = "OrderPlaced"
type EventType string

// String returns the type's name.
func (t EventType) String() string { return string(t) }

// AggregateType names the kind of entity an event is about, such as "order".
type AggregateType string

// String returns the aggregate type's name.
func (t AggregateType) String() string { return string(t) }

// Limits enforced when an event is published.
const (
	// MaxPayloadBytes is the largest payload accepted: exactly 1 MiB is
	// allowed, one byte more is rejected.
	MaxPayloadBytes = 1 << 20
	// MaxErrorChars is the most characters of a handler's error kept in
	// the row's last_error column.
	MaxErrorChars = 4000
	// MaxIDLen is the longest event id accepted.
	MaxIDLen = 64
	// MaxDelay is how far ahead Envelope.NotBefore may be.
	MaxDelay = 365 * 24 * time.Hour
	// MaxClockSkew is how far in the past Envelope.NotBefore may be: a
	// time computed a moment ago, or on a clock a little behind; it is
	// then delivered at once. Further back it is refused, as a mistake.
	MaxClockSkew = time.Minute
	// MaxTypeLen is the longest event type accepted.
	MaxTypeLen = 128
	// MaxAggregateTypeLen is the longest aggregate type accepted.
	MaxAggregateTypeLen = 64
	// MaxAggregateIDLen is the longest aggregate id accepted.
	MaxAggregateIDLen = 128
	// MaxTenantIDLen is the longest tenant id accepted.
	MaxTenantIDLen = 64
	// MaxHeadersBytes is the most bytes the headers may take once encoded
	// as a JSON object (keys, values, quotes and escapes): what every
	// supported database stores in the headers column (a MySQL TEXT holds
	// 65,535 bytes).
	MaxHeadersBytes = 65535
)

// Envelope is one event as published by business code and as received by
// handlers. Exactly one of JSON and Bytes carries the payload.
//
// Publish copies the payload and the headers, so the caller may reuse them
// afterwards. The handlers of the subscriptions of one event share that
// copy: they must not modify the payload or the headers.
type Envelope struct {
	// ID identifies the event; consumers de-duplicate on it. Defaults to a
	// new ULID, monotonic within the process.
	ID string
	// Type is the event's type. Required. Like every text field of the
	// envelope (ID, AggregateType, AggregateID, TenantID, OrderingKey,
	// header values), it must be printable: Publish refuses control
	// characters (tab, CR, LF, ESC, DEL, C1), U+2028, U+2029 and the
	// bidirectional controls, which connectors refuse or terminals obey.
	Type EventType
	// OccurredAt is when the event happened. Defaults to the time of Publish.
	OccurredAt time.Time
	// AggregateType and AggregateID name the entity the event is about.
	AggregateType AggregateType
	AggregateID   string
	// TenantID is carried through untouched for multi-tenant services.
	TenantID string
	// OrderingKey is the key whose events an Ordered subscription
	// receives in order (see Order). Defaults to AggregateType and
	// AggregateID joined by ":" (see Key); at most MaxOrderingKeyLen
	// bytes. Brokers' connectors use it as the message key.
	OrderingKey string
	// Headers are string metadata (trace ids, content types). Keys must be
	// HTTP-style tokens; values must be printable UTF-8 text: no control
	// characters (tab, CR, LF, ESC, DEL, C1), no U+2028/U+2029 and no
	// bidirectional controls, which some connector refuses (an HTTP
	// header) or a terminal obeys. Encoded as a JSON object they take at
	// most MaxHeadersBytes.
	Headers map[string]string
	// JSON is the payload as a JSON document. It must be valid JSON.
	JSON json.RawMessage
	// Bytes is the payload as opaque bytes, for events that are not JSON.
	Bytes []byte
	// NotBefore delays the event: no subscription receives it before
	// then. The wait runs on the database's clock, as leases do, from the
	// delay NotBefore makes on this instance's clock at Publish. Zero, or
	// a time already passed (by at most MaxClockSkew): at once. At most
	// MaxDelay ahead. A delayed event skips the hot path: the poller takes
	// it once due, woken then on the instance that published it (within
	// a few milliseconds while it runs, else at the next poll). An
	// ordered event that waits holds back the later events of its key.
	// The store must implement driver.Scheduler (sqlstore and outboxtest
	// do). NotBefore is not stored: a handler's Event has it zero.
	NotBefore time.Time

	// ordered is set on an event delivered in order of its key; seq is
	// its number in the key's sequence, if known.
	ordered bool
	seq     int64
	// delay is how long after its insert the event is due (NotBefore);
	// due is when, on this instance's clock, once the store scheduled it.
	delay time.Duration
	due   time.Time
}

// Payload returns the payload, whichever of JSON and Bytes carries it.
func (e *Envelope) Payload() []byte {
	if e.JSON != nil {
		return e.JSON
	}
	return e.Bytes
}

// IsJSON reports whether the payload is a JSON document.
func (e *Envelope) IsJSON() bool { return e.JSON != nil }

// ValidationError reports an envelope that Publish refused. It names the
// field and the rule, never the payload or a header value.
type ValidationError struct {
	Field  string // the Envelope field at fault, e.g. "JSON" or "Headers"
	Reason string
}

func (e *ValidationError) Error() string {
	return "outbox: invalid envelope: " + e.Field + ": " + e.Reason
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// validate checks e without changing it.
func (e *Envelope) validate() error {
	if e.Type == "" {
		return invalid("Type", "required")
	}
	if err := e.validateMetadata(); err != nil {
		return err
	}
	if err := e.validatePayload(); err != nil {
		return err
	}
	return validateHeaders(e.Headers)
}

// validateMetadata checks e's text fields with checkText, in field order,
// and that the key the event is ordered by fits MaxOrderingKeyLen.
func (e *Envelope) validateMetadata() error {
	for _, f := range [...]struct {
		name  string
		value string
		max   int
	}{
		{"Type", string(e.Type), MaxTypeLen},
		{"ID", e.ID, MaxIDLen}, // "" passes: it defaults to a new ULID
		{"AggregateType", string(e.AggregateType), MaxAggregateTypeLen},
		{"AggregateID", e.AggregateID, MaxAggregateIDLen},
		{"TenantID", e.TenantID, MaxTenantIDLen},
		{"OrderingKey", e.OrderingKey, MaxOrderingKeyLen},
	} {
		if err := checkText(f.name, f.value, f.max); err != nil {
			return err
		}
	}
	if k := e.Key(); len(k) > MaxOrderingKeyLen {
		return invalid("OrderingKey", "the default key (aggregate type and id) is %d bytes, over %d: set a shorter OrderingKey", len(k), MaxOrderingKeyLen)
	}
	return nil
}

// validatePayload checks that exactly one of e.JSON and e.Bytes is set,
// that the payload fits MaxPayloadBytes, and that a JSON payload is valid
// JSON.
func (e *Envelope) validatePayload() error {
	switch {
	case e.JSON != nil && e.Bytes != nil:
		return invalid("JSON", "set exactly one of JSON and Bytes, not both")
	case e.JSON == nil && e.Bytes == nil:
		return invalid("JSON", "a payload is required: set JSON or Bytes")
	}
	if n := len(e.Payload()); n > MaxPayloadBytes {
		field := "Bytes"
		if e.JSON != nil {
			field = "JSON"
		}
		return invalid(field, "payload is %d bytes, over the limit of %d bytes (1 MiB)", n, MaxPayloadBytes)
	}
	if e.JSON != nil && !json.Valid(e.JSON) {
		return invalid("JSON", "payload is not valid JSON (%d bytes)", len(e.JSON))
	}
	return nil
}

// validateHeaders checks that every header key is a token and every value
// printable UTF-8 text (see findUnsafe).
func validateHeaders(hs map[string]string) error {
	for k, v := range hs {
		if !isToken(k) {
			return invalid("Headers", "key %q is not a token (letters, digits and !#$%%&'*+-.^_`|~ only)", truncateKey(k))
		}
		if !utf8.ValidString(v) {
			return invalid("Headers", "value of key %q is not valid UTF-8", k)
		}
		if i, r, what := findUnsafe(v); what != "" {
			return invalid("Headers", "value of key %q has %s (%U) at byte %d; %s", k, what, r, i, unsafeFix)
		}
	}
	return nil
}

// checkText validates a short identifier-like field.
func checkText(field, s string, max int) error {
	if len(s) > max {
		return invalid(field, "%d bytes, over the limit of %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return invalid(field, "not valid UTF-8")
	}
	if i, r, what := findUnsafe(s); what != "" {
		return invalid(field, "has %s (%U) at byte %d; %s", what, r, i, unsafeFix)
	}
	return nil
}

// unsafeFix is the advice of an error of findUnsafe's.
const unsafeFix = "metadata must be printable text: remove it, or carry such data in the payload"

// findUnsafe returns the first character of s that some connector
// refuses or that a terminal or log viewer obeys rather than shows: C0
// controls (tab, CR and LF among them), DEL, C1 controls, the line and
// paragraph separators, and the bidirectional marks, embeddings,
// overrides and isolates. An HTTP header refuses the controls (the
// webhook's event would be dead on its first attempt); the separators
// break lines in logs and JSON-in-JavaScript; the bidi controls make
// outboxctl and the admin page show text in another order than stored.
// It returns what = "" when s is clean.
func findUnsafe(s string) (at int, r rune, what string) {
	for i, r := range s {
		switch {
		case r < 0x20, r == 0x7f:
			return i, r, "a control character"
		case r >= 0x80 && r <= 0x9f:
			return i, r, "a C1 control character"
		case r == 0x2028, r == 0x2029:
			return i, r, "a line or paragraph separator"
		case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return i, r, "a bidirectional control character"
		}
	}
	return 0, 0, ""
}

func truncateKey(k string) string {
	if len(k) > 64 {
		return k[:64] + "…"
	}
	return k
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0:
		default:
			return false
		}
	}
	return true
}

// clone returns a deep copy of e, so that neither the caller nor a handler
// can change what the other sees.
func (e Envelope) clone() Envelope {
	if e.JSON != nil {
		e.JSON = bytes.Clone(e.JSON)
	}
	if e.Bytes != nil {
		e.Bytes = bytes.Clone(e.Bytes)
	}
	if e.Headers != nil {
		e.Headers = maps.Clone(e.Headers)
	}
	return e
}

// ids makes ULIDs that are strictly increasing across all goroutines of the
// process, even within one millisecond: ulid.Make is only monotonic per
// goroutine-free call sequence, so a locked generator is used instead.
var ids = struct {
	sync.Mutex
	entropy *ulid.MonotonicEntropy
}{entropy: ulid.Monotonic(rand.Reader, 0)}

// NewID returns a new ULID string, greater than every one returned before it
// in this process.
func NewID() string {
	ids.Lock()
	defer ids.Unlock()
	id, err := ulid.New(ulid.Now(), ids.entropy)
	if err != nil {
		// The monotonic entropy overflows only after 2^80 ids in one
		// millisecond; wait for the next millisecond.
		for err != nil {
			time.Sleep(time.Millisecond)
			id, err = ulid.New(ulid.Now(), ids.entropy)
		}
	}
	return id.String()
}

// encode validates env, fills its defaults and returns the row to insert.
// The payload is copied once; the returned Envelope shares it with the row.
func encode(env Envelope, now time.Time) (driver.Row, Envelope, error) {
	if err := env.validate(); err != nil {
		return driver.Row{}, Envelope{}, err
	}
	if err := checkNotBefore(env.NotBefore, now); err != nil {
		return driver.Row{}, Envelope{}, err
	}
	env = env.clone()
	if env.ID == "" {
		env.ID = NewID()
	}
	if d := env.NotBefore.Sub(now); !env.NotBefore.IsZero() && d > 0 {
		env.delay = d
	}
	if env.OccurredAt.IsZero() {
		env.OccurredAt = now
	}
	env.OccurredAt = env.OccurredAt.UTC().Truncate(time.Microsecond)
	row := driver.Row{
		ID:            env.ID,
		Type:          string(env.Type),
		AggregateType: string(env.AggregateType),
		AggregateID:   env.AggregateID,
		TenantID:      env.TenantID,
		Payload:       env.Payload(),
		PayloadJSON:   env.IsJSON(),
		OccurredAt:    env.OccurredAt,
		OrderingKey:   env.OrderingKey,
	}
	if len(env.Headers) > 0 {
		h, err := json.Marshal(env.Headers)
		if err != nil {
			return driver.Row{}, Envelope{}, invalid("Headers", "cannot be encoded")
		}
		if len(h) > MaxHeadersBytes {
			return driver.Row{}, Envelope{}, invalid("Headers", "%d bytes encoded as JSON, over the limit of %d bytes (MaxHeadersBytes); move large metadata into the payload", len(h), MaxHeadersBytes)
		}
		row.Headers = h
	}
	return row, env, nil
}

// checkNotBefore refuses a NotBefore more than MaxDelay ahead of now or
// more than MaxClockSkew behind it.
func checkNotBefore(t, now time.Time) error {
	switch {
	case t.IsZero():
		return nil
	case t.Sub(now) > MaxDelay:
		return invalid("NotBefore", "%s is %v ahead, more than MaxDelay (%v): schedule it nearer, or keep the plan in your own table and publish when it is near", t.UTC().Format(time.RFC3339), t.Sub(now).Round(time.Second), MaxDelay)
	case now.Sub(t) > MaxClockSkew:
		return invalid("NotBefore", "%s is %v in the past, more than MaxClockSkew (%v): leave it zero to deliver at once", t.UTC().Format(time.RFC3339), now.Sub(t).Round(time.Second), MaxClockSkew)
	}
	return nil
}

// DecodeError reports a stored row that cannot be turned back into an
// Envelope. It never contains the payload or header values.
type DecodeError struct {
	ID     string
	Reason string
}

func (e *DecodeError) Error() string {
	return "outbox: cannot decode event " + e.ID + ": " + e.Reason
}

// decode turns a stored row back into an Envelope.
func decode(r *driver.Row) (Envelope, error) {
	if r.ReadError != nil {
		return Envelope{}, &DecodeError{ID: r.ID, Reason: r.ReadError.Error()}
	}
	if r.Type == "" {
		return Envelope{}, &DecodeError{ID: r.ID, Reason: "event type is empty"}
	}
	env := Envelope{
		ID:            r.ID,
		Type:          EventType(r.Type),
		OccurredAt:    r.OccurredAt,
		AggregateType: AggregateType(r.AggregateType),
		AggregateID:   r.AggregateID,
		TenantID:      r.TenantID,
		OrderingKey:   r.OrderingKey,
		ordered:       r.KeySeq > 0,
		seq:           r.KeySeq,
	}
	if len(r.Headers) > 0 {
		var h map[string]string
		// The json error text is not kept: it may quote the header values.
		if json.Unmarshal(r.Headers, &h) != nil {
			return Envelope{}, &DecodeError{ID: r.ID, Reason: "headers are not a JSON object of strings"}
		}
		if len(h) > 0 {
			env.Headers = h
		}
	}
	payload := r.Payload
	if payload == nil {
		payload = []byte{}
	}
	if r.PayloadJSON {
		if !json.Valid(payload) {
			return Envelope{}, &DecodeError{ID: r.ID, Reason: "payload is marked JSON but is not valid JSON"}
		}
		env.JSON = payload
	} else {
		env.Bytes = payload
	}
	return env, nil
}
