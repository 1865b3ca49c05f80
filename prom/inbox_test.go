package prom_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/prom"
)

// The inbox's results count by consumer and result, through a real
// Inbox on SQLite.
func TestInboxMetricsCountResults(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := prom.NewInbox(reg)
	if err != nil {
		t.Fatal(err)
	}
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	ib, err := inbox.New(db.DB, inbox.Config{Dialect: inbox.SQLite, Table: strings.Trim(store.Table(), `"`), MaxAttempts: 2, Observe: m.Observe})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context, inbox.Message) error { return nil }
	bad := func(context.Context, inbox.Message) error { return errors.New("bad") }
	ib.Handle(ctx, "billing", inbox.Message{ID: "a"}, ok)
	ib.Handle(ctx, "billing", inbox.Message{ID: "a"}, ok)
	ib.Handle(ctx, "billing", inbox.Message{ID: "b"}, bad)
	ib.Handle(ctx, "billing", inbox.Message{ID: "b"}, bad)
	ib.Handle(ctx, "billing", inbox.Message{}, ok)
	want := `
# HELP txoutbox_inbox_messages_total Messages handled by the inbox, by consumer and result (applied, duplicate, failed, parked, rejected).
# TYPE txoutbox_inbox_messages_total counter
txoutbox_inbox_messages_total{consumer="billing",result="applied"} 1
txoutbox_inbox_messages_total{consumer="billing",result="duplicate"} 1
txoutbox_inbox_messages_total{consumer="billing",result="failed"} 1
txoutbox_inbox_messages_total{consumer="billing",result="parked"} 1
txoutbox_inbox_messages_total{consumer="billing",result="rejected"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "txoutbox_inbox_messages_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "txoutbox_inbox_handle_seconds"); n != 5 {
		t.Errorf("%d duration series, want 5", n)
	}
}
