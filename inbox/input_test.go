package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// Bad input is Rejected with an error that names the problem and the way
// out; nothing is written and the handler is not called.
func TestBadInputRejected(t *testing.T) {
	e := setup(t, "sqlite", inbox.Config{MaxPayload: 10})
	ctx := context.Background()
	never := func(context.Context, inbox.Message) error {
		t.Error("handler called for bad input")
		return nil
	}
	cases := []struct {
		name, consumer string
		m              inbox.Message
		is             error
		says           string
	}{
		{"no id", "c", inbox.Message{}, inbox.ErrNoID, "DeriveID"},
		{"too large", "c", inbox.Message{ID: "x", Payload: make([]byte, 11)}, inbox.ErrTooLarge, "11 bytes, the limit is 10"},
		{"long id", "c", inbox.Message{ID: strings.Repeat("x", 256)}, nil, "more than 255"},
		{"nul in id", "c", inbox.Message{ID: "a\x00b"}, nil, "NUL"},
		{"bad utf-8", "c", inbox.Message{ID: "\xff"}, nil, "UTF-8"},
		{"no consumer", "", inbox.Message{ID: "x"}, nil, "consumer name is empty"},
	}
	for _, c := range cases {
		res, err := e.ib.Handle(ctx, c.consumer, c.m, never)
		if res != inbox.Rejected || res.Settled() || err == nil || !strings.Contains(err.Error(), c.says) || (c.is != nil && !errors.Is(err, c.is)) {
			t.Errorf("%s: %v %v, want Rejected saying %q", c.name, res, err, c.says)
		}
	}
	if n := e.count(t, "SELECT COUNT(*) FROM "+e.store.InboxTable()); n != 0 {
		t.Errorf("%d inbox rows after bad input", n)
	}
}

func TestDeriveID(t *testing.T) {
	a, b := inbox.DeriveID("orders", "3", "42"), inbox.DeriveID("orders", "3", "42")
	if a != b || !strings.HasPrefix(a, "sha256:") || len(a) != 71 {
		t.Errorf("DeriveID not stable or malformed: %q %q", a, b)
	}
	if inbox.DeriveID("ab", "c") == inbox.DeriveID("a", "bc") {
		t.Error("DeriveID(\"ab\", \"c\") == DeriveID(\"a\", \"bc\")")
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	db := testdb.SQLite(t)
	for _, c := range []struct {
		cfg  inbox.Config
		says string
	}{
		{inbox.Config{}, "Config.Dialect is nil"},
		{inbox.Config{Dialect: inbox.SQLite, Table: "a.b.c"}, "at most one dot"},
		{inbox.Config{Dialect: inbox.SQLite, Table: "x-y"}, "letters, digits or underscores"},
		{inbox.Config{Dialect: inbox.SQLite, MaxAttempts: -1}, "MaxAttempts -1 is negative"},
	} {
		if _, err := inbox.New(db.DB, c.cfg); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("New(%+v): %v, want an error saying %q", c.cfg, err, c.says)
		}
	}
	if _, err := inbox.DialectNamed("oracle"); err == nil {
		t.Error("DialectNamed(oracle) gave no error")
	}
}
