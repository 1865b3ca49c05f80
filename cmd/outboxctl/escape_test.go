package main

import "testing"

func TestEscape(t *testing.T) {
	for in, want := range map[string]string{
		"plain ascii, ünïcödé, 日本":      "plain ascii, ünïcödé, 日本",
		"\x1b[31mred\x1b[0m":            `\x1b[31mred\x1b[0m`,
		"title\x1b]0;pwned\x07":         `title\x1b]0;pwned\x07`,
		"del\x7f c1\u0085\u009b":        `del\x7f c1\u0085\u009b`,
		"rlo\u202egnp.exe lri\u2066":    `rlo\u202egnp.exe lri\u2066`,
		"lrm\u200e zwj\u200d bom\ufeff": `lrm\u200e zwj\u200d bom\ufeff`,
		"ls\u2028ps\u2029":              `ls\u2028ps\u2029`,
		"tab\tnl\ncr\r":                 `tab\tnl\ncr\r`,
		"bad \xff utf8":                 `bad \xff utf8`,
	} {
		if got := esc(in); got != want {
			t.Errorf("esc(%q) = %q; want %q", in, got, want)
		}
	}
	if got := escLines("a\nb\x1b\r"); got != "a\nb\\x1b\\r" {
		t.Errorf("escLines = %q", got)
	}
}
