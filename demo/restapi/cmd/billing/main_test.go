package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// started is a billing run in the background.
type started struct {
	results chan inbox.Observation
	addr    string
	stop    func() error // ends the run and returns its error
	// state, if set, describes the broker's side for a failure message
	// (the consumer's pending and unacknowledged counts).
	state func() string
}

func start(t *testing.T, o options) *started {
	t.Helper()
	s := &started{results: make(chan inbox.Observation, 64)}
	addrs := make(chan net.Addr, 1)
	o.addr, o.retryDelay = "127.0.0.1:0", 10*time.Millisecond
	o.observe = func(ob inbox.Observation) { s.results <- ob }
	o.listening = func(a net.Addr) { addrs <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, io.Discard, slog.New(slog.DiscardHandler)) }()
	select {
	case a := <-addrs:
		s.addr = a.String()
	case err := <-done:
		cancel()
		t.Fatalf("billing did not start: %v", err)
	}
	stopped := false
	s.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { s.stop() })
	return s
}

// wait returns the results of the next n messages handled.
func (s *started) wait(t *testing.T, n int) map[string]inbox.Result {
	t.Helper()
	got := map[string]inbox.Result{}
	var seen []string // every observation, for the failure message
	timeout := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case ob := <-s.results:
			seen = append(seen, fmt.Sprintf("%s %v after %v (err %v)", ob.MessageID, ob.Result, ob.Duration, ob.Err))
			if ob.Result == inbox.Failed { // the poison message, before it is parked
				continue
			}
			got[ob.MessageID] = ob.Result
		case <-timeout:
			state := ""
			if s.state != nil {
				state = s.state()
			}
			t.Fatalf("%d of %d messages handled within 30s: %v; %s; every result seen, in order:\n%s", len(got), n, got, state, strings.Join(seen, "\n"))
		}
	}
	return got
}

func (s *started) get(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + s.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
}

// billing takes the orders service's messages, as natsoutbox publishes
// them, from the real NATS server through the inbox: one invoice per
// order, voided by its cancellation, each with an event through billing's
// own outbox in the same transaction; a message that is not an order is
// parked. Run again with the stream delivered from the start (the durable
// consumer deleted), every message is a duplicate and nothing changes.
func TestBillsEachOrderOnce(t *testing.T) {
	url := testbroker.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := outbox.NewID()
	stream, prefix := "BILLING_TEST_"+id, "billingtest"+strings.ToLower(id)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), stream)
	publish := func(typ, body string) string {
		evID := outbox.NewID()
		msg := nats.NewMsg(prefix + "." + typ)
		msg.Header.Set(jetstream.MsgIDHeader, evID)
		msg.Header.Set("txoutbox-id", evID)
		msg.Header.Set("txoutbox-type", typ)
		msg.Data = []byte(body)
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		return evID
	}
	placed1 := publish("OrderPlaced", `{"order_id":1,"customer":"ada","items":[],"total_cents":2500}`)
	placed2 := publish("OrderPlaced", `{"order_id":2,"customer":"grace","items":[],"total_cents":597}`)
	cancelled1 := publish("OrderCancelled", `{"order_id":1,"total_cents":2500}`)
	poison := publish("OrderPlaced", `{"order_id":"x","card":"4242"}`)

	dir := t.TempDir()
	o := options{natsURL: url, stream: stream, dataDir: dir, adminToken: "s3cret"}
	consumerState := func() string {
		c, err := js.Consumer(ctx, stream, consumerName)
		if err != nil {
			return fmt.Sprintf("consumer: %v", err)
		}
		i, err := c.Info(ctx)
		if err != nil {
			return fmt.Sprintf("consumer info: %v", err)
		}
		return fmt.Sprintf("consumer: %d pending, %d delivered and not acked, %d redelivered, %d pull requests waiting",
			i.NumPending, i.NumAckPending, i.NumRedelivered, i.NumWaiting)
	}
	b := start(t, o)
	b.state = consumerState
	got := b.wait(t, 4)
	want := map[string]inbox.Result{placed1: inbox.Applied, placed2: inbox.Applied, cancelled1: inbox.Applied, poison: inbox.Parked}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("message %s: %v, want %v (all: %v)", id, got[id], w, got)
		}
	}
	var inv struct{ Invoices []invoice }
	b.get(t, "/invoices", &inv)
	wantInv := []invoice{{1, "ada", 2500, "void"}, {2, "grace", 597, "open"}}
	if len(inv.Invoices) != 2 || inv.Invoices[0] != wantInv[0] || inv.Invoices[1] != wantInv[1] {
		t.Errorf("invoices %+v, want %+v", inv.Invoices, wantInv)
	}
	var parked struct {
		Parked []struct {
			ID        string
			Attempts  int
			LastError string `json:"last_error"`
		}
	}
	b.get(t, "/parked", &parked)
	if len(parked.Parked) != 1 || parked.Parked[0].ID != poison || parked.Parked[0].Attempts != 5 || !strings.Contains(parked.Parked[0].LastError, "payload is not an order") {
		t.Errorf("parked %+v, want the poison message after 5 attempts", parked.Parked)
	}
	// The admin page lists it, by its escaped id, without its payload.
	r, _ := http.NewRequest("GET", "http://"+b.addr+"/admin/inbox", nil)
	r.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `href="/admin/inbox/billing/`+poison+`"`) || strings.Contains(string(page), "4242") {
		t.Errorf("admin page: %d\n%s", resp.StatusCode, page)
	}
	if err := b.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// The whole stream again: all duplicates.
	if err := js.DeleteConsumer(ctx, stream, consumerName); err != nil {
		t.Fatal(err)
	}
	b = start(t, o)
	b.state = consumerState
	for id, res := range b.wait(t, 4) {
		if res != inbox.Duplicate {
			t.Errorf("redelivered %s: %v, want duplicate", id, res)
		}
	}
	b.get(t, "/invoices", &inv)
	if len(inv.Invoices) != 2 || inv.Invoices[0] != wantInv[0] || inv.Invoices[1] != wantInv[1] {
		t.Errorf("invoices after the redelivery %+v, want %+v", inv.Invoices, wantInv)
	}
	if err := b.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// billing's own events: one per applied order message, delivered.
	db, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "billing.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT event_type, aggregate_id FROM outbox_event ORDER BY aggregate_id, event_type`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var events []string
	for rows.Next() {
		var typ, agg string
		if err := rows.Scan(&typ, &agg); err != nil {
			t.Fatal(err)
		}
		events = append(events, typ+"/"+agg)
	}
	if got := strings.Join(events, " "); got != "InvoiceIssued/1 InvoiceVoided/1 InvoiceIssued/2" {
		t.Errorf("billing's outbox holds %q, want InvoiceIssued/1 InvoiceVoided/1 InvoiceIssued/2", got)
	}
}

// Without the stream, billing says to start the demo with NATS_URL.
func TestNeedsTheStream(t *testing.T) {
	url := testbroker.NATS(t)
	err := run(context.Background(), options{natsURL: url, stream: "BILLING_MISSING_" + outbox.NewID(), addr: "127.0.0.1:0", dataDir: t.TempDir()}, io.Discard, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "start the demo with NATS_URL") {
		t.Fatalf("got %v, want the fix named", err)
	}
}
