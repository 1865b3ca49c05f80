package amqpoutbox

import (
	"fmt"
	"strings"

	"github.com/txoutbox/txoutbox/outbox"
)

// MaxRoutingKeyLen is the longest routing key AMQP 0-9-1 carries (a short
// string).
const MaxRoutingKeyLen = 255

// The fields a routing key template may name, each between braces.
var keyFields = map[string]func(ev *outbox.Event) string{
	"type":           func(ev *outbox.Event) string { return string(ev.Type) },
	"aggregate_type": func(ev *outbox.Event) string { return string(ev.AggregateType) },
	"aggregate_id":   func(ev *outbox.Event) string { return ev.AggregateID },
	"tenant_id":      func(ev *outbox.Event) string { return ev.TenantID },
}

// keyTemplate is a parsed routing key template: literal text and fields.
type keyTemplate []keyPart

type keyPart struct {
	lit   string
	field func(ev *outbox.Event) string // nil for a literal
}

// parseKey parses a routing key template such as "orders.{type}".
func parseKey(s string) (keyTemplate, error) {
	var t keyTemplate
	rest := s
	for rest != "" {
		open := strings.IndexAny(rest, "{}")
		if open < 0 {
			t = append(t, keyPart{lit: rest})
			break
		}
		if rest[open] == '}' {
			return nil, fmt.Errorf("amqpoutbox: routing key template %q: '}' without '{'", s)
		}
		if open > 0 {
			t = append(t, keyPart{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("amqpoutbox: routing key template %q: '{' without '}'", s)
		}
		name := rest[open+1 : open+end]
		f, ok := keyFields[name]
		if !ok {
			return nil, fmt.Errorf("amqpoutbox: routing key template %q: unknown field {%s}; use {type}, {aggregate_type}, {aggregate_id} or {tenant_id}", s, name)
		}
		t = append(t, keyPart{field: f})
		rest = rest[open+end+1:]
	}
	if n := t.literalLen(); n > MaxRoutingKeyLen {
		return nil, fmt.Errorf("amqpoutbox: routing key template %q: %d bytes of fixed text, over AMQP's limit of %d", s, n, MaxRoutingKeyLen)
	}
	return t, nil
}

func (t keyTemplate) literalLen() int {
	n := 0
	for _, p := range t {
		n += len(p.lit)
	}
	return n
}

// render returns ev's routing key.
func (t keyTemplate) render(ev *outbox.Event) string {
	if len(t) == 1 && t[0].field != nil {
		return t[0].field(ev)
	}
	var b strings.Builder
	for _, p := range t {
		if p.field != nil {
			b.WriteString(p.field(ev))
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}
