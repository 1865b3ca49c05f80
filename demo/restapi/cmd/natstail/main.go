// Command natstail prints the messages of the demo's NATS stream as they
// arrive: what a consumer of the orders service's events receives.
//
//	go run ./demo/restapi/cmd/natstail [-nats-url nats://127.0.0.1:4222] [-new] [-n N]
//
// Start the demo with NATS_URL set first: it creates the stream ORDERS
// (subjects orders.<event type>). natstail reads it from the first message
// (-new: only those published from now on) until Ctrl-C, or until it has
// printed N messages. It only reads: an ordered consumer, nothing is
// acknowledged or removed.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txoutbox/txoutbox/outbox/meta"
)

func main() {
	url := nats.DefaultURL
	if v := os.Getenv("NATS_URL"); v != "" {
		url = v
	}
	var o options
	flag.StringVar(&o.url, "nats-url", url, "NATS server (env NATS_URL)")
	flag.StringVar(&o.stream, "stream", "ORDERS", "stream to read")
	flag.BoolVar(&o.onlyNew, "new", false, "print only the messages published from now on")
	flag.IntVar(&o.max, "n", 0, "exit after printing this many messages (0: until Ctrl-C)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		log.SetFlags(0)
		log.Fatal("natstail: ", err)
	}
}

type options struct {
	url, stream string
	onlyNew     bool
	max         int
}

// run prints the stream's messages to out until ctx ends or o.max were
// printed.
func run(ctx context.Context, o options, out io.Writer) error {
	nc, err := nats.Connect(o.url, nats.Name("txoutbox-demo-natstail"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to %s: %w (is a NATS server running? set -nats-url or NATS_URL)", o.url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, o.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("no stream %s on %s yet: start the demo with NATS_URL=%s first (it creates the stream)", o.stream, o.url, o.url)
	}
	if err != nil {
		return fmt.Errorf("stream %s: %w", o.stream, err)
	}
	policy := jetstream.DeliverAllPolicy
	if o.onlyNew {
		policy = jetstream.DeliverNewPolicy
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: policy})
	if err != nil {
		return err
	}
	msgs, err := cons.Messages()
	if err != nil {
		return err
	}
	defer msgs.Stop()
	stopped := context.AfterFunc(ctx, msgs.Stop) // ends Next below
	defer stopped()
	fmt.Fprintf(out, "natstail: reading stream %s on %s (Ctrl-C stops)\n", o.stream, nc.ConnectedUrlRedacted())
	for n := 0; o.max == 0 || n < o.max; n++ {
		msg, err := msgs.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		printMessage(out, msg)
	}
	return nil
}

// printMessage prints one message: its subject, stream sequence and
// outbox metadata, then its body (JSON on one line).
func printMessage(w io.Writer, msg jetstream.Msg) {
	h := msg.Headers()
	seq := uint64(0)
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	occurred := h.Get(meta.OccurredAt)
	if t, err := time.Parse(meta.TimeFormat, occurred); err == nil {
		occurred = t.Format(time.RFC3339Nano)
	}
	fmt.Fprintf(w, "#%d %s  %s=%s  aggregate=%s/%s  occurred=%s\n", seq, msg.Subject(),
		meta.ID, h.Get(meta.ID), h.Get(meta.AggregateType), h.Get(meta.AggregateID), occurred)
	var compact bytes.Buffer
	if json.Compact(&compact, msg.Data()) == nil {
		fmt.Fprintf(w, "    %s\n", compact.Bytes())
	} else {
		fmt.Fprintf(w, "    %q\n", msg.Data()) // not JSON: quoted, control characters escaped
	}
}
