package redisoutbox

import (
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

// Decode rebuilds the envelope of an entry a Publisher added, for
// consumers written in Go: the metadata fields become the envelope's
// fields, the other fields its headers, and payloadField ("" for
// DefaultPayloadField) its JSON or Bytes, according to content-type.
// Consumers de-duplicate on the returned ID.
func Decode(m redis.XMessage, payloadField string) (outbox.Envelope, error) {
	if payloadField == "" {
		payloadField = DefaultPayloadField
	}
	str := func(v any) string {
		switch v := v.(type) {
		case string:
			return v
		case []byte:
			return string(v)
		case nil:
			return ""
		}
		return fmt.Sprint(v)
	}
	raw, ok := m.Values[payloadField]
	if !ok {
		return outbox.Envelope{}, fmt.Errorf("redisoutbox: Decode: entry %s has no %q field", m.ID, payloadField)
	}
	if _, ok := m.Values[meta.ID]; !ok {
		return outbox.Envelope{}, fmt.Errorf("redisoutbox: Decode: entry %s has no %s field", m.ID, meta.ID)
	}
	keys := make([]string, 0, len(m.Values))
	for k := range m.Values {
		if k != payloadField {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	env, err := meta.Envelope(func(k string) string { return str(m.Values[k]) }, keys, []byte(str(raw)))
	if err != nil {
		return env, fmt.Errorf("redisoutbox: Decode: entry %s: %w", m.ID, err)
	}
	if env.Bytes != nil {
		// A content-type other than JSON: keep it, as the publisher had it.
		if ct := str(m.Values[meta.ContentType]); ct != "" && ct != "application/octet-stream" {
			if env.Headers == nil {
				env.Headers = map[string]string{}
			}
			env.Headers[meta.ContentType] = ct
		}
	}
	return env, nil
}
