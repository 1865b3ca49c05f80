package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Engine cases: Publish, PublishTx and PublishAll over the store.

// 18.1: a rolled-back transaction leaves no row, fires no listener and
// counts in no metric.
func testAtomicity(t *testing.T, e *env) {
	cfg := fastConfig()
	m := &counting{}
	cfg.Metrics = m
	ob := e.outbox(t, cfg)
	rec := newRecorder(1)
	ob.Handle("all", rec.listen)
	start(t, ob)
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rolledBack, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.(driver.Inspector).Inspect(ctx, rolledBack); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Inspect rolled-back event: err = %v, want ErrNotFound", err)
	}
	if n := m.published.Load(); n != 0 {
		t.Fatalf("Metrics.Published called %d times for a rolled-back event, want 0", n)
	}
	// A committed event after it is delivered; the rolled-back one never.
	committed := e.publish(t, ob, outbox.Envelope{Type: typeB, JSON: []byte(payload)})
	rec.wait(t, wait)
	closeNow(t, ob)
	counts, _ := rec.snapshot()
	if counts[rolledBack] != 0 || counts[committed] != 1 {
		t.Fatalf("deliveries = %v; want only %s once", counts, committed)
	}
	if n := m.published.Load(); n != 1 {
		t.Fatalf("Metrics.Published called %d times, want 1 (the committed event)", n)
	}
	e.wantDelivered(t, 1)
}

const (
	orderPlaced outbox.EventType     = "OrderPlaced"
	orderAgg    outbox.AggregateType = "order"
)

// 18.5 and 18.6: typed event and aggregate types round-trip on both paths.
func testTyped(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	got := make(chan outbox.Event, 2)
	ob.Handle("listener-3", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, orderPlaced)
	start(t, ob)
	when := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	e.publish(t, ob, outbox.Envelope{Type: orderPlaced, AggregateType: orderAgg, AggregateID: "o-1", TenantID: "t-1", OccurredAt: when, JSON: []byte(payload)})
	hot := recv(t, got, "hot delivery")
	cold := e.outbox(t, outbox.Config{DisableHotPath: true})
	e.publish(t, cold, outbox.Envelope{Type: orderPlaced, AggregateType: orderAgg, AggregateID: "o-1", TenantID: "t-1", OccurredAt: when, JSON: []byte(payload)})
	polled := recv(t, got, "cold delivery")
	for _, ev := range []outbox.Event{hot, polled} {
		if ev.Type != orderPlaced || ev.AggregateType != orderAgg || ev.AggregateType.String() != "order" || ev.AggregateID != "o-1" || ev.TenantID != "t-1" || !ev.OccurredAt.Equal(when) {
			t.Fatalf("%s path delivered %+v", ev.Path, ev.Envelope)
		}
	}
	if hot.Path != outbox.PathHot || polled.Path != outbox.PathCold {
		t.Fatalf("paths %s, %s; want hot, cold", hot.Path, polled.Path)
	}
}

// Publish without a transaction fails fast and writes nothing.
func testNoTx(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	_, err := ob.Publish(context.Background(), outbox.Envelope{Type: typeA, JSON: []byte(payload)})
	if !errors.Is(err, outbox.ErrNoTx) || !strings.Contains(err.Error(), "PublishTx") {
		t.Fatalf("Publish without tx: %v; want ErrNoTx saying how to fix it", err)
	}
	if _, err := outbox.Publish(context.Background(), outbox.Envelope{Type: typeA, JSON: []byte(payload)}); outbox.Default() == nil && !errors.Is(err, outbox.ErrNoOutbox) {
		t.Fatalf("package Publish without outbox: %v; want ErrNoOutbox", err)
	}
	ctx := outbox.NewContext(context.Background(), ob)
	if _, err := outbox.Publish(ctx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("package Publish with outbox, without tx: %v; want ErrNoTx", err)
	}
	if s := e.stats(t); s.New != 0 {
		t.Fatalf("rows written: %+v", s)
	}
}

// Invalid envelopes are rejected with an error naming the field, the
// payload is never echoed, and nothing is written.
func testInvalid(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	secret := "SECRET-PAYLOAD-TEXT"
	cases := []struct {
		env   outbox.Envelope
		field string
	}{
		{outbox.Envelope{JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA}, "JSON"},
		{outbox.Envelope{Type: typeA, JSON: []byte("{}"), Bytes: []byte("x")}, "JSON"},
		{outbox.Envelope{Type: typeA, JSON: []byte(`{"a":"` + secret + `"`)}, "JSON"},
		{outbox.Envelope{Type: typeA, Bytes: make([]byte, outbox.MaxPayloadBytes+1)}, "Bytes"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"bad key": "v"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\r\nInjected: 1"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), ID: strings.Repeat("x", 65)}, "ID"},
		// What a connector refuses (the webhook's HTTP headers) or a
		// terminal obeys is refused at Publish, not found dead later.
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\x1b[31m"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\x7f"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\u0085"}}, "Headers"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": secret + "\u2028"}}, "Headers"},
		{outbox.Envelope{Type: typeA + "\u202e", JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA + "\x1b", JSON: []byte(payload)}, "Type"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42\u2029"}, "AggregateID"},
		{outbox.Envelope{Type: typeA, JSON: []byte(payload), AggregateID: "42\x07"}, "AggregateID"},
	}
	for _, c := range cases {
		_, err := ob.PublishTx(ctx, tx, c.env)
		var ve *outbox.ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field {
			t.Errorf("PublishTx(headers %s, type %q): %v; want a ValidationError for %s", truncated(fmt.Sprintf("%q", c.env.Headers), 80), c.env.Type, err, c.field)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error echoes the payload or header value: %v", err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := e.stats(t); s.New != 0 {
		t.Fatalf("rows written: %+v", s)
	}
}

// Payloads of exactly 1 MiB, JSON and binary, reach listeners byte-exact on
// the hot and the cold path; one byte more is rejected.
func testPayloadRoundTrip(t *testing.T, e *env) {
	bin := randomBytes(outbox.MaxPayloadBytes)
	bin[0], bin[1] = 0, 0xff // NUL and a byte that is never valid UTF-8
	js := []byte(`"` + strings.Repeat("a", outbox.MaxPayloadBytes-2) + `"`)
	small := []byte("{ \"spaced\" :  [1, 2.50, \"\\u00e9\"] }") // not normalised
	got := make(chan outbox.Event, 6)
	listen := func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }
	hot := e.outbox(t, fastConfig())
	hot.Handle("all", listen)
	start(t, hot)
	coldCfg := fastConfig()
	coldCfg.DisableHotPath = true
	cold := e.outbox(t, coldCfg)
	cold.Handle("all", listen)
	start(t, cold)
	want := map[string][]byte{}
	for _, ob := range []*outbox.Outbox{hot, cold} {
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, Bytes: bin})] = bin
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: js})] = js
		want[e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: small})] = small
	}
	paths := map[outbox.Path]int{}
	for range want {
		ev := recv(t, got, "a large event")
		if !bytes.Equal(ev.Payload(), want[ev.ID]) {
			t.Fatalf("%s path: payload of %d bytes differs from the %d published", ev.Path, len(ev.Payload()), len(want[ev.ID]))
		}
		if ev.IsJSON() != (ev.Bytes == nil) {
			t.Fatalf("payload kind lost")
		}
		paths[ev.Path]++
	}
	if paths[outbox.PathHot] != 3 || paths[outbox.PathCold] != 3 {
		t.Fatalf("paths %v, want 3 hot and 3 cold", paths)
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = hot.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, Bytes: make([]byte, outbox.MaxPayloadBytes+1)})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "1048577") || !strings.Contains(err.Error(), "1048576") {
		t.Fatalf("1 MiB + 1: %v; want a ValidationError naming the size and the limit", err)
	}
}

// The largest headers Publish accepts are stored and delivered byte-exact
// on every database; one byte more is refused with an error naming the
// limit.
func testLargestHeaders(t *testing.T, e *env) {
	ob := e.outbox(t, fastConfig())
	got := make(chan outbox.Event, 1)
	ob.Handle("all", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil })
	start(t, ob)
	// {"k":"vvv…"} is 8 bytes plus the value.
	value := strings.Repeat("v", outbox.MaxHeadersBytes-8)
	id := e.publish(t, ob, outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": value}})
	if ev := recv(t, got, "the event with the largest headers"); ev.ID != id || ev.Headers["k"] != value {
		t.Fatalf("headers did not round-trip (%d bytes)", len(ev.Headers["k"]))
	}
	ctx := context.Background()
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = ob.PublishTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload), Headers: map[string]string{"k": value + "v"}})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "Headers" || !strings.Contains(err.Error(), fmt.Sprint(outbox.MaxHeadersBytes)) {
		t.Fatalf("headers one byte over the limit: %v; want a ValidationError naming the limit", err)
	}
}

// PublishAll writes several events in one call (through BatchInserter when
// the store has it, in chunks), all or none: an invalid envelope anywhere
// writes nothing and the error names its index; after commit every event
// is delivered once, with exactly its bytes.
func testPublishAll(t *testing.T, e *env) {
	cfg := fastConfig()
	cfg.HotQueueSize = 2000
	ob := e.outbox(t, cfg)
	ctx := context.Background()

	// All or none.
	tx, err := e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ob.PublishAllTx(ctx, tx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}, outbox.Envelope{Type: typeA})
	var ve *outbox.ValidationError
	if !errors.As(err, &ve) || ve.Field != "JSON" || !strings.Contains(err.Error(), "envelope 1 of 2") {
		t.Fatalf("PublishAllTx with an invalid second envelope: %v; want a ValidationError naming envelope 1", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := e.stats(t); s.New+s.Done+s.Retry+s.Dead != 0 {
		t.Fatalf("rows after a rejected PublishAll: %+v; want none", s)
	}
	if _, err := ob.PublishAll(ctx, outbox.Envelope{Type: typeA, JSON: []byte(payload)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("PublishAll without a transaction: %v; want ErrNoTx", err)
	}

	// 1,200 events (more than one INSERT), one of them 1 MiB of bytes.
	const n = 1200
	envs := make([]outbox.Envelope, n)
	for i := range envs {
		envs[i] = outbox.Envelope{Type: typeA, AggregateID: fmt.Sprint(i), JSON: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: map[string]string{"n": fmt.Sprint(i)}}
	}
	big := make([]byte, outbox.MaxPayloadBytes)
	for i := range big {
		big[i] = byte(i * 7)
	}
	envs[600] = outbox.Envelope{Type: typeA, AggregateID: "600", Bytes: big}
	rec := newRecorder(n)
	ob.Handle("all", rec.listen)
	start(t, ob)
	tx, err = e.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := ob.PublishAll(txctx.With(ctx, tx), envs...)
	if err != nil {
		tx.Rollback()
		t.Fatalf("PublishAll: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if len(ids) != n {
		t.Fatalf("%d ids for %d events", len(ids), n)
	}
	rec.wait(t, wait)
	closeNow(t, ob)
	counts, events := rec.snapshot()
	byID := map[string]outbox.Event{}
	for _, ev := range events {
		byID[ev.ID] = ev
	}
	for i, id := range ids {
		ev := byID[id]
		if counts[id] != 1 || ev.AggregateID != fmt.Sprint(i) {
			t.Fatalf("event %d (%s): delivered %d times, aggregate %q", i, id, counts[id], ev.AggregateID)
		}
		if i == 600 {
			if !bytes.Equal(ev.Bytes, big) {
				t.Fatal("the 1 MiB payload was not delivered byte for byte")
			}
		} else if string(ev.JSON) != fmt.Sprintf(`{"n":%d}`, i) || ev.Headers["n"] != fmt.Sprint(i) {
			t.Fatalf("event %d: payload %s headers %v", i, ev.JSON, ev.Headers)
		}
	}
	e.wantDelivered(t, int64(n))
}
