package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// TestInboxSmoke runs the inbox rows tiny (200 messages, 100 duplicates,
// one repeat) on each database so CI proves both loops consume every
// message on both brokers (RunInbox fails if a business row is missing)
// and the report renders. The numbers belong to `make bench-inbox`.
func TestInboxSmoke(t *testing.T) {
	nats := testbroker.NATS(t)
	for _, d := range Dialects {
		t.Run(d.Key, func(t *testing.T) {
			db := testdb.MySQL(t)
			if d == PostgreSQL {
				db = testdb.Postgres(t)
			}
			rep := &InboxReport{}
			err := RunInbox(context.Background(), d, db, rep, InboxOptions{Addrs: BrokerAddrs{NATS: nats}, N: 200, Dups: 100, Repeats: 1})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range rep.Cells {
				t.Logf("%s, %s: %d messages in %v", c.Broker, c.System, c.N, c.Elapsed)
			}
			if len(rep.Cells) != 4 || len(rep.Dups) != 3 {
				t.Fatalf("%d consumption cells, %d duplicate cells; want 4, 3", len(rep.Cells), len(rep.Dups))
			}
			for _, c := range rep.Dups {
				if c.System == DupDupName && (c.Statements != 1 || c.HandlerCalls != 0 || c.RowsWritten != 0) {
					t.Errorf("duplicates: %+v", c)
				}
			}
			var buf bytes.Buffer
			rep.Write(&buf)
			for _, want := range []string{"## Inbox", "| " + d.Name + " | NATS JetStream |", "| " + d.Name + " | Kafka (kfake, in-process) |", DupDupName} {
				if !strings.Contains(buf.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, buf.String())
				}
			}
			if ts := rep.Targets(); len(ts) != 3 {
				t.Errorf("targets: %+v", ts)
			}
		})
	}
}
