package natsoutbox

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox"
)

// DefaultSubject is the subject template used when Config.Subject is
// empty: one subject per event type under "events".
const DefaultSubject = "events.{type}"

// The placeholders a subject template may contain.
const (
	// PlaceholderType is the event type. A '.' in the type separates
	// tokens, as in NATS ("order.created" under "events.{type}" is
	// "events.order.created"), so consumers can filter on type
	// hierarchies ("events.order.>").
	PlaceholderType = "{type}"
	// PlaceholderAggregateType is the aggregate type; its '.' separate
	// tokens, like the type's.
	PlaceholderAggregateType = "{aggregate_type}"
	// PlaceholderAggregateID is the aggregate id; a '.' in it is replaced
	// with '_' (an id is one token).
	PlaceholderAggregateID = "{aggregate_id}"
	// PlaceholderTenant is the tenant id; a '.' in it is replaced with '_'.
	PlaceholderTenant = "{tenant}"
)

// part is a piece of a subject template: literal text, or a placeholder.
type part struct {
	lit string
	ph  string // one of the Placeholder constants, or "" for a literal
}

// template is a parsed subject template.
type template struct {
	src   string
	parts []part
}

// parseTemplate validates a subject template: tokens separated by '.',
// none empty, the first one literal (so that no event can reach the
// "$JS", "$SYS" or other system subjects through its type), literal text
// without wildcards or whitespace, and only the known placeholders.
func parseTemplate(s string) (*template, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("natsoutbox: subject template %q: %s", s, fmt.Sprintf(format, args...))
	}
	if s == "" {
		return nil, bad("empty")
	}
	t := &template{src: s}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			return nil, bad("token %d is empty (a leading, trailing or doubled '.')", i+1)
		}
		if i == 0 && strings.Contains(tok, "{") {
			return nil, bad("the first token must be literal text, such as \"events\"")
		}
		if i > 0 {
			t.parts = append(t.parts, part{lit: "."})
		}
		rest := tok
		for rest != "" {
			open := strings.IndexByte(rest, '{')
			if open < 0 {
				open = len(rest)
			}
			lit := rest[:open]
			if strings.ContainsRune(lit, '}') {
				return nil, bad("'}' without '{'")
			}
			for _, r := range lit {
				if r == '*' || r == '>' || !validRune(r) {
					return nil, bad("%q is not allowed in a subject (wildcards, whitespace and control characters are not)", r)
				}
			}
			if lit != "" {
				t.parts = append(t.parts, part{lit: lit})
			}
			rest = rest[open:]
			if rest == "" {
				break
			}
			end := strings.IndexByte(rest, '}')
			if end < 0 {
				return nil, bad("'{' without '}'")
			}
			ph := rest[:end+1]
			switch ph {
			case PlaceholderType, PlaceholderAggregateType, PlaceholderAggregateID, PlaceholderTenant:
			default:
				return nil, bad("unknown placeholder %s (known: {type}, {aggregate_type}, {aggregate_id}, {tenant})", ph)
			}
			t.parts = append(t.parts, part{ph: ph})
			rest = rest[end+1:]
		}
	}
	return t, nil
}

// validRune reports whether r may appear in a subject token as it is.
func validRune(r rune) bool {
	return r != utf8.RuneError && r > ' ' && r != 0x7f && !unicode.IsSpace(r) && !unicode.IsControl(r)
}

// subject renders the template for ev.
func (t *template) subject(ev *outbox.Event) string {
	var b strings.Builder
	for _, p := range t.parts {
		switch p.ph {
		case "":
			b.WriteString(p.lit)
		case PlaceholderType:
			writeTokens(&b, string(ev.Type))
		case PlaceholderAggregateType:
			writeTokens(&b, string(ev.AggregateType))
		case PlaceholderAggregateID:
			b.WriteString(Token(ev.AggregateID))
		case PlaceholderTenant:
			b.WriteString(Token(ev.TenantID))
		}
	}
	return b.String()
}

// writeTokens writes s as one or more tokens: '.' stays a separator, and
// each token is sanitised by Token.
func writeTokens(b *strings.Builder, s string) {
	for i, tok := range strings.Split(s, ".") {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(Token(tok))
	}
}

// Token turns s into one subject token, the way the subject template
// fills {aggregate_id} and {tenant} (and each '.'-separated part of {type}
// and {aggregate_type}): '.', the wildcards '*' and '>', whitespace,
// control characters and invalid UTF-8 are each replaced with '_', and an
// empty s becomes "_". Different values can therefore share a token ("a b"
// and "a_b"); the exact values travel in the headers.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for _, r := range s {
		if r == '.' || r == '*' || r == '>' || !validRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == '.' || r == '*' || r == '>' || !validRune(r) {
			r = '_'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// uses reports whether the template contains the placeholder ph.
func (t *template) uses(ph string) bool {
	for _, p := range t.parts {
		if p.ph == ph {
			return true
		}
	}
	return false
}

// filter renders the template for events of type typ as a subject filter:
// the tokens that depend on the aggregate id or the tenant are '*', and
// from a token with {aggregate_type} on (which may span several tokens),
// or with {type} when typ is "" (every type), the filter ends with '>'.
func (t *template) filter(typ outbox.EventType) string {
	ev := &outbox.Event{Envelope: outbox.Envelope{Type: typ}}
	toks := strings.Split(t.src, ".")
	out := make([]string, 0, len(toks))
	for _, tok := range toks {
		switch {
		case strings.Contains(tok, PlaceholderAggregateType),
			typ == "" && strings.Contains(tok, PlaceholderType):
			// It may span several tokens: match whatever follows.
			return strings.Join(append(out, ">"), ".")
		case strings.Contains(tok, PlaceholderAggregateID), strings.Contains(tok, PlaceholderTenant):
			out = append(out, "*")
		case strings.Contains(tok, PlaceholderType):
			sub, _ := parseTemplate("x." + tok)
			out = append(out, strings.TrimPrefix(sub.subject(ev), "x."))
		default:
			out = append(out, tok)
		}
	}
	return strings.Join(out, ".")
}
