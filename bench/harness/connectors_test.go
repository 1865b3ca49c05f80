package harness

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
)

// TestConnectorsSmoke runs every cell of the connector table tiny (200
// events, one producer) so CI proves each way to each broker still builds,
// delivers and is verified on the broker: a lost event fails it. The
// numbers belong to `make bench-connectors`.
func TestConnectorsSmoke(t *testing.T) {
	db := testdb.MySQL(t)
	for _, name := range BrokerNames {
		t.Run(name, func(t *testing.T) {
			var addrs BrokerAddrs
			switch name {
			case "nats":
				addrs.NATS = testbroker.NATS(t)
			case "amqp":
				addrs.AMQP = testbroker.AMQP(t)
			case "redis":
				addrs.Redis = testbroker.Redis(t)
			}
			res, err := RunConnectors(context.Background(), db, ConnOptions{
				Brokers: []string{name}, Addrs: addrs, N: 200, TxSize: 20,
				// One producer commits in id order: Watermill's SQL
				// subscriber, which reads by id, cannot skip a row
				// committed late.
				Producers: 1, Timeout: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			r := res[0]
			for _, c := range []ConnCell{r.Raw, r.Tx, r.TxDrain, r.Wm, r.WmDrain} {
				t.Logf("%s: %s", c.Way, c)
				if c.Err != "" || c.Lost != 0 || c.Acked != 200 || c.OnBroker != 200 {
					t.Errorf("%s: acked %d, on broker %d, lost %d, err %q", c.Way, c.Acked, c.OnBroker, c.Lost, c.Err)
				}
			}
			if r.TxPerRaw == 0 || r.TxPerWm == 0 || r.Verdict == "" {
				t.Errorf("ratios not computed: %+v", r)
			}
			var buf bytes.Buffer
			(&ConnReport{Options: ConnOptions{N: 200, Producers: 1, TxSize: 20}, Results: res, StandaloneHeader: true}).Write(&buf)
			if !strings.Contains(buf.String(), "| "+r.Broker+" |") {
				t.Errorf("report lacks the %s row:\n%s", r.Broker, buf.String())
			}
		})
	}
}
