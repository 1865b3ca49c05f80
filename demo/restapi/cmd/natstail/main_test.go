package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// natstail prints the stream's messages, metadata and body, from the
// first; it names the fix when the stream does not exist yet.
func TestPrintsTheStream(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := outbox.NewID()
	stream, subject := "NATSTAIL_"+id, "natstail"+strings.ToLower(id)+".OrderPlaced"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), stream)
	msg := nats.NewMsg(subject)
	msg.Header.Set("txoutbox-id", "01ABC")
	msg.Header.Set("txoutbox-aggregate-type", "order")
	msg.Header.Set("txoutbox-aggregate-id", "1")
	msg.Header.Set("txoutbox-occurred-at", "2026-05-04T09:30:00.123456Z")
	msg.Data = []byte("{\n  \"id\": 1\n}")
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte("not\x00json")); err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	if err := run(ctx, options{url: url, stream: stream, max: 2}, &out); err != nil {
		t.Fatal(err)
	}
	want := "#1 " + subject + "  txoutbox-id=01ABC  aggregate=order/1  occurred=2026-05-04T09:30:00.123456Z\n" +
		"    {\"id\":1}\n" +
		"#2 " + subject + "  txoutbox-id=  aggregate=/  occurred=\n" +
		"    \"not\\x00json\"\n"
	if _, got, _ := strings.Cut(out.String(), "\n"); got != want {
		t.Errorf("printed:\n%s\nwant, after the first line:\n%s", out.String(), want)
	}

	// Until Ctrl-C: the context ends the wait for the next message.
	pr, pw := io.Pipe()
	tctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(tctx, options{url: url, stream: stream, onlyNew: true}, pw); pw.Close() }()
	if line, err := bufio.NewReader(pr).ReadString('\n'); err != nil || !strings.HasPrefix(line, "natstail: reading stream "+stream) {
		t.Fatalf("first line %q (%v)", line, err)
	}
	go io.Copy(io.Discard, pr)
	stop()
	if err := <-done; err != nil {
		t.Errorf("after the context ended: %v, want nil", err)
	}

	err = run(ctx, options{url: url, stream: "NATSTAIL_MISSING_" + id}, &out)
	if err == nil || !strings.Contains(err.Error(), "start the demo with NATS_URL") {
		t.Errorf("missing stream: err = %v", err)
	}
}

func TestMain(m *testing.M) { leakcheck.Main(m) }
