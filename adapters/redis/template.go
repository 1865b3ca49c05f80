package redisoutbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/txoutbox/txoutbox/outbox"
)

// The placeholders of StreamTemplate.
var placeholders = map[string]func(ev *outbox.Event) string{
	"type":           func(ev *outbox.Event) string { return string(ev.Type) },
	"aggregate_type": func(ev *outbox.Event) string { return string(ev.AggregateType) },
	"tenant":         func(ev *outbox.Event) string { return ev.TenantID },
}

// template is a parsed stream key: literal text and placeholders.
type template struct {
	src   string
	parts []part
}

type part struct {
	lit  string
	name string // a placeholder, when not ""
}

// parseTemplate parses a stream key with ${name} placeholders. A '$' is
// only allowed as the start of a placeholder ("$$" is a literal '$').
func parseTemplate(s string) (*template, error) {
	if s == "" {
		return nil, errors.New("redisoutbox: empty stream key")
	}
	t := &template{src: s}
	var lit strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			lit.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '$' {
			lit.WriteByte('$')
			i++
			continue
		}
		if i+1 >= len(s) || s[i+1] != '{' {
			return nil, fmt.Errorf("redisoutbox: stream template %q: '$' at %d does not start a ${placeholder} (write $$ for a '$')", s, i)
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return nil, fmt.Errorf("redisoutbox: stream template %q: unclosed ${ at %d", s, i)
		}
		name := s[i+2 : i+2+end]
		if placeholders[name] == nil {
			return nil, fmt.Errorf("redisoutbox: stream template %q: unknown placeholder ${%s} (known: ${type}, ${aggregate_type}, ${tenant})", s, name)
		}
		if lit.Len() > 0 {
			t.parts = append(t.parts, part{lit: lit.String()})
			lit.Reset()
		}
		t.parts = append(t.parts, part{name: name})
		i += 2 + end
	}
	if lit.Len() > 0 {
		t.parts = append(t.parts, part{lit: lit.String()})
	}
	return t, nil
}

// expand returns the stream key of ev.
func (t *template) expand(ev *outbox.Event) (string, error) {
	if len(t.parts) == 1 && t.parts[0].name == "" {
		return t.parts[0].lit, nil
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.name == "" {
			b.WriteString(p.lit)
			continue
		}
		v := placeholders[p.name](ev)
		if v == "" {
			return "", fmt.Errorf("redisoutbox: event %s has no %s for the stream template %q", ev.ID, p.name, t.src)
		}
		b.WriteString(v)
	}
	return b.String(), nil
}
