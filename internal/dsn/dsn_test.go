package dsn

import (
	"errors"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct{ in, driver, display, contains string }{
		{"sqlite:/tmp/x.db", "sqlite", "sqlite /tmp/x.db", "/tmp/x.db"},
		{"file:x.db", "sqlite", "sqlite x.db", "x.db"},
		{"postgres://u:secret@h:5432/db?sslmode=disable", "pgx", "postgres u@h:5432/db", "sslmode=disable"},
		{"mysql://u:secret@h/db?timeout=5s", "mysql", "mysql u@h:3306/db", "timeout=5s"},
		{"u:secret@tcp(h:3307)/db", "mysql", "mysql u@h:3307/db", "parseTime=true"},
	} {
		d, err := Parse(tc.in)
		if err != nil || d.Driver != tc.driver || d.Display != tc.display || !strings.Contains(d.DSN, tc.contains) {
			t.Errorf("Parse(%q) = %+v, %v", tc.in, d, err)
		}
	}
	for _, bad := range []string{"", "oracle://u:secret@h/db", "postgres://", "sqlite:"} {
		if _, err := Parse(bad); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, in := range []string{
		"postgres://u:s3cr%21t@h/db", "mysql://u:s3cr!t@h/db", "u:s3cr!t@tcp(h:3306)/db", "mysql://u:s3cr!t@h/db?x=%zz",
	} {
		p := Password(in)
		if p != "s3cr!t" && p != "s3cr%21t" {
			t.Errorf("Password(%q) = %q", in, p)
		}
		err := Redact(errors.New("dial "+in+": s3cr!t s3cr%21t"), p)
		if strings.Contains(err.Error(), "s3cr") {
			t.Errorf("Redact: %v", err)
		}
	}
	if err := Redact(nil, "x"); err != nil {
		t.Error(err)
	}
}
