package outbox

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox/driver"
)

func TestValidate(t *testing.T) {
	ok := Envelope{Type: "T", JSON: []byte(`{}`)}
	exact := make([]byte, MaxPayloadBytes)
	type validateCase struct {
		name  string
		env   Envelope
		field string // "" means valid
		msg   string
	}
	cases := []validateCase{
		{"minimal JSON", ok, "", ""},
		{"raw bytes, binary", Envelope{Type: "T", Bytes: []byte{0, 0xff}}, "", ""},
		{"exactly 1 MiB", Envelope{Type: "T", Bytes: exact}, "", ""},
		{"empty JSON document is invalid", Envelope{Type: "T", JSON: []byte{}}, "JSON", "not valid JSON"},
		{"missing type", Envelope{JSON: []byte(`{}`)}, "Type", "required"},
		{"type with newline", Envelope{Type: "T\n", JSON: []byte(`{}`)}, "Type", "U+000A"},
		{"type too long", Envelope{Type: EventType(strings.Repeat("t", MaxTypeLen+1)), JSON: []byte(`{}`)}, "Type", "limit of 128"},
		{"no payload", Envelope{Type: "T"}, "JSON", "payload is required"},
		{"both payloads", Envelope{Type: "T", JSON: []byte(`{}`), Bytes: []byte("x")}, "JSON", "not both"},
		{"1 MiB + 1", Envelope{Type: "T", Bytes: make([]byte, MaxPayloadBytes+1)}, "Bytes", "1048577 bytes, over the limit of 1048576"},
		{"invalid JSON", Envelope{Type: "T", JSON: []byte(`{"a":`)}, "JSON", "not valid JSON"},
		{"header key with space", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"a b": "v"}}, "Headers", "not a token"},
		{"empty header key", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"": "v"}}, "Headers", "not a token"},
		{"header value CR", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"k": "a\rb"}}, "Headers", "U+000D"},
		{"header value LF", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"k": "a\nb"}}, "Headers", "U+000A"},
		{"header value NUL", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"k": "a\x00b"}}, "Headers", "U+0000"},
		{"token punctuation allowed", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"X-Trace_id.v1!#$%&'*+^`|~": "v"}}, "", ""},
		{"id too long", Envelope{Type: "T", JSON: []byte(`{}`), ID: strings.Repeat("i", 65)}, "ID", "limit of 64"},
		{"aggregate id too long", Envelope{Type: "T", JSON: []byte(`{}`), AggregateID: strings.Repeat("i", 129)}, "AggregateID", "limit of 128"},
		{"tenant not UTF-8", Envelope{Type: "T", JSON: []byte(`{}`), TenantID: "\xff"}, "TenantID", "UTF-8"},
		{"printable non-ASCII allowed", Envelope{Type: "注文.placé", AggregateID: "Ærø-١٢", JSON: []byte(`{}`), Headers: map[string]string{"k": "naïve – “ok” 🙂"}}, "", ""},
		{"header value space allowed", Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"k": " a b "}}, "", ""},
	}
	// What some connector refuses (the webhook's HTTP headers, terminals,
	// log lines): every field named below refuses each of these.
	refused := []struct{ name, s, code string }{
		{"ESC", "a\x1b[31mb", "U+001B"},
		{"BEL", "a\x07", "U+0007"},
		{"TAB", "a\tb", "U+0009"},
		{"DEL", "a\x7fb", "U+007F"},
		{"C1 NEL", "a\u0085b", "U+0085"},
		{"C1 CSI", "a\u009bb", "U+009B"},
		{"line separator", "a\u2028b", "U+2028"},
		{"paragraph separator", "a\u2029b", "U+2029"},
		{"right-to-left override", "a\u202eb", "U+202E"},
		{"left-to-right embedding", "a\u202ab", "U+202A"},
		{"right-to-left isolate", "a\u2067b", "U+2067"},
		{"right-to-left mark", "a\u200fb", "U+200F"},
	}
	for _, r := range refused {
		cases = append(cases,
			validateCase{"header value " + r.name, Envelope{Type: "T", JSON: []byte(`{}`), Headers: map[string]string{"k": r.s}}, "Headers", r.code},
			validateCase{"type " + r.name, Envelope{Type: EventType(r.s), JSON: []byte(`{}`)}, "Type", r.code},
			validateCase{"aggregate id " + r.name, Envelope{Type: "T", AggregateID: r.s, JSON: []byte(`{}`)}, "AggregateID", r.code},
			validateCase{"aggregate type " + r.name, Envelope{Type: "T", AggregateType: AggregateType(r.s), JSON: []byte(`{}`)}, "AggregateType", r.code},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.env.validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("validate: %v; want a ValidationError on %s saying %q", err, c.field, c.msg)
			}
		})
	}
}

func TestEncodeCopiesAndFillsDefaults(t *testing.T) {
	payload := []byte(`{"a":1}`)
	headers := map[string]string{"k": "v"}
	now := time.Date(2026, 5, 6, 7, 8, 9, 123456789, time.FixedZone("X", 3600))
	row, env, err := encode(Envelope{Type: "T", JSON: payload, Headers: headers}, now)
	if err != nil {
		t.Fatal(err)
	}
	payload[2], headers["k"] = 'X', "changed"
	if string(env.JSON) != `{"a":1}` || env.Headers["k"] != "v" || string(row.Payload) != `{"a":1}` {
		t.Fatalf("caller's later changes reached the event: %s %v", env.JSON, env.Headers)
	}
	if len(env.ID) != 26 || row.ID != env.ID {
		t.Fatalf("id %q / %q, want a ULID in both", env.ID, row.ID)
	}
	if want := now.UTC().Truncate(time.Microsecond); !env.OccurredAt.Equal(want) || env.OccurredAt.Location() != time.UTC {
		t.Fatalf("OccurredAt %v, want %v in UTC", env.OccurredAt, want)
	}
	if string(row.Headers) != `{"k":"v"}` || !row.PayloadJSON {
		t.Fatalf("row headers %s json %v", row.Headers, row.PayloadJSON)
	}
	back, err := decode(&row)
	if err != nil || back.ID != env.ID || string(back.JSON) != `{"a":1}` || back.Headers["k"] != "v" {
		t.Fatalf("decode: %+v, %v", back, err)
	}
}

func TestDecodeErrorsNeverQuoteContent(t *testing.T) {
	const secret = "s3cr3t"
	for _, r := range []driver.Row{
		{ID: "1", Type: "T", Headers: []byte(`{"k":"` + secret), Payload: []byte(`{}`), PayloadJSON: true},
		{ID: "2", Type: "T", Headers: []byte(`{"k":1}`), Payload: []byte(`{}`), PayloadJSON: true},
		{ID: "3", Type: "T", Payload: []byte(`{"k":"` + secret), PayloadJSON: true},
		{ID: "4", Type: "", Payload: []byte(`{}`), PayloadJSON: true},
	} {
		_, err := decode(&r)
		var de *DecodeError
		if !errors.As(err, &de) || de.ID != r.ID {
			t.Fatalf("row %s: %v, want a DecodeError", r.ID, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("decode error quotes the content: %v", err)
		}
	}
}

// Ids made concurrently by many goroutines are unique, and each goroutine
// sees its own ids strictly increase, even within one millisecond.
func TestNewIDMonotonicAcrossGoroutines(t *testing.T) {
	const goroutines, each = 8, 5000
	results := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			ids := make([]string, each)
			for i := range ids {
				ids[i] = NewID()
			}
			results[g] = ids
		})
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*each)
	for _, ids := range results {
		if !slices.IsSorted(ids) {
			t.Fatal("ids of one goroutine are not increasing")
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("duplicate id %s", id)
			}
			seen[id] = true
		}
	}
	// Sequential calls: strictly increasing.
	prev := NewID()
	for range 10000 {
		id := NewID()
		if id <= prev {
			t.Fatalf("%s after %s", id, prev)
		}
		prev = id
	}
}

func TestExponentialBackoffBounds(t *testing.T) {
	b := ExponentialBackoff{Base: 200 * time.Millisecond, Max: 60 * time.Second}
	wantCeil := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond}
	for i, w := range wantCeil {
		if got := b.Ceiling(i + 1); got != w {
			t.Fatalf("Ceiling(%d) = %v, want %v", i+1, got, w)
		}
	}
	if got := b.Ceiling(40); got != 60*time.Second {
		t.Fatalf("Ceiling(40) = %v, want the 60s cap", got)
	}
	for failures := 1; failures <= 12; failures++ {
		ceil := b.Ceiling(failures)
		lo, hi := ceil/2, ceil*3/2
		var below, above bool
		for range 2000 {
			d := b.Delay(failures)
			if d < lo || d >= hi {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v)", failures, d, lo, hi)
			}
			below = below || d < ceil
			above = above || d > ceil
		}
		if !below || !above {
			t.Fatalf("Delay(%d): no jitter on both sides of %v", failures, ceil)
		}
	}
}

func TestConfigValidationNamesTheField(t *testing.T) {
	cases := []struct {
		cfg   Config
		field string
	}{
		{Config{Workers: -1}, "Config.Workers"},
		{Config{HotQueueSize: -5}, "Config.HotQueueSize"},
		{Config{PollBatchSize: -1}, "Config.PollBatchSize"},
		{Config{PollInterval: -time.Second}, "Config.PollInterval"},
		{Config{Lease: time.Millisecond}, "Config.Lease"},
		{Config{PollInterval: time.Minute, PollMaxInterval: time.Second}, "Config.PollMaxInterval"},
		{Config{InstanceID: strings.Repeat("x", 65)}, "Config.InstanceID"},
		{Config{MaxAttempts: -1}, "Config.MaxAttempts"},
		{Config{Retention: -time.Hour}, "Config.Retention"},
		{Config{ArchiveRetention: -time.Hour}, "Config.ArchiveRetention"},
		{Config{CleanupDead: true}, "Config.CleanupDead"},
		{Config{Retention: time.Hour, CleanupInterval: -time.Minute}, "Config.CleanupInterval"},
		{Config{Retention: time.Hour, CleanupBatchSize: -1}, "Config.CleanupBatchSize"},
	}
	for _, c := range cases {
		if err := c.cfg.validate(); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("validate(%+v) = %v; want an error naming %s", c.cfg, err, c.field)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("New(nil store) succeeded")
	}
	// A retention needs a store that can delete rows.
	if _, err := New(&clockStore{}, Config{Retention: time.Hour}); err == nil || !strings.Contains(err.Error(), "driver.Cleaner") {
		t.Errorf("New with Retention on a store without Cleanup = %v; want an error naming driver.Cleaner", err)
	}
	// An archive's retention needs a store that keeps one.
	if _, err := New(&clockStore{}, Config{ArchiveRetention: time.Hour}); err == nil || !strings.Contains(err.Error(), "driver.Archiver") || !strings.Contains(err.Error(), "ArchiveRetention") {
		t.Errorf("New with ArchiveRetention on a store without an archive = %v; want an error naming driver.Archiver and the field", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.Workers != 4 || c.HotQueueSize != 1000 || c.ColdQueueSize != 1000 || c.PollInterval != 5*time.Second ||
		c.PollBatchSize != 200 || c.SkipRecent != time.Second || c.MaxAttempts != 10 || c.Lease != 30*time.Second {
		t.Fatalf("defaults: %+v", c)
	}
	if b, ok := c.Retry.(ExponentialBackoff); !ok || b.Base != 200*time.Millisecond || b.Max != time.Minute {
		t.Fatalf("retry default %+v", c.Retry)
	}
	if c.InstanceID == "" || c.Logger == nil || c.Metrics == nil || c.Classify == nil {
		t.Fatalf("unset defaults: %+v", c)
	}
	if DefaultClassifier(errors.New("x")) != DecisionRetry || DefaultClassifier(Permanent(errors.New("x"))) != DecisionDead {
		t.Fatal("DefaultClassifier")
	}
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
}

func TestTruncateError(t *testing.T) {
	s := strings.Repeat("é", MaxErrorChars+10)
	got := errorText(s)
	if n := len([]rune(got)); n != MaxErrorChars || !strings.HasPrefix(s, got) {
		t.Fatalf("truncated to %d characters", n)
	}
	if errorText("short") != "short" {
		t.Fatal("short error changed")
	}
}
