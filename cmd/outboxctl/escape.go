package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// esc makes s safe to print on a terminal in text output: control
// characters (C0, DEL, C1: colour codes, window-title escapes, BEL, a
// carriage return that overwrites the line), format characters
// (right-to-left overrides and other bidi controls, zero-width ones),
// line and paragraph separators and invalid UTF-8 are written as Go
// escapes (\x1b, \u202e, \xff), so that data written by an application or
// an attacker (error text, aggregate ids, payloads) cannot drive the
// terminal or disguise itself. Tabs and newlines are escaped too: a value
// stays on its line and in its column. -json output is never escaped.
func esc(s string) string { return escape(s, false) }

// escLines is esc for multi-line text (a payload, an error message): it
// keeps newlines.
func escLines(s string) string { return escape(s, true) }

func escape(s string, keepNewlines bool) string {
	if !needsEscape(s, keepNewlines) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' && keepNewlines:
			b.WriteByte('\n')
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case unsafeRune(r) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(s string, keepNewlines bool) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || (unsafeRune(r) && !(r == '\n' && keepNewlines)) {
			return true
		}
		i += size
	}
	return false
}

// unsafeRune: controls (Cc: C0, DEL, C1), format characters (Cf: bidi
// embeddings, overrides and isolates, LRM/RLM, ALM, zero-width
// characters, the BOM) and the line and paragraph separators.
func unsafeRune(r rune) bool {
	return unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029'
}
