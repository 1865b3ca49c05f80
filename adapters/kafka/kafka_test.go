package kafkaoutbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	kafkaoutbox "github.com/txoutbox/txoutbox/adapters/kafka"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/meta"
)

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func publisher(t testing.TB, cl *kgo.Client, cfg kafkaoutbox.Config) *kafkaoutbox.Publisher {
	t.Helper()
	p, err := kafkaoutbox.New(cl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A committed event becomes one record: key = ordering key, value = the
// payload byte for byte, headers = every meta header in meta's order,
// the user header and the trace context included.
func TestCommitProducesOneRecord(t *testing.T) {
	c := cluster(t)
	topic := topicName(t)
	createTopic(t, c, topic, nil)
	pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	e := newEngine(t, outbox.Subscription{Name: "to-kafka", Batch: pub.Handler()}, outbox.Config{})

	payload := []byte(`{"id":42,"item":"book","note":"bytes \u00e9 kept"}`)
	at := time.Date(2026, 11, 23, 10, 0, 0, 123456000, time.UTC) // the store keeps microseconds
	ids := e.publish(t, true, outbox.Envelope{
		Type: "OrderPlaced", AggregateType: "order", AggregateID: "42", TenantID: "acme", OccurredAt: at,
		Headers: map[string]string{"traceparent": traceparent, "x-user": "u1"},
		JSON:    payload,
	})
	if st := e.waitFinal(t, 15*time.Second, ids...)[ids[0]]; st.Status != outbox.StatusDone {
		t.Fatalf("state %+v", st)
	}
	recs := consume(t, c, topic, 1)
	if n := endOffset(t, c, topic); n != 1 {
		t.Fatalf("%d records on the topic, want 1", n)
	}
	r := recs[0]
	if !bytes.Equal(r.Value, payload) {
		t.Fatalf("value %q, want %q", r.Value, payload)
	}
	if string(r.Key) != "order:42" {
		t.Fatalf("key %q, want the ordering key, aggregate type and id", r.Key)
	}
	want := []meta.Header{
		{Key: meta.ID, Value: ids[0]}, {Key: meta.Type, Value: "OrderPlaced"},
		{Key: meta.AggregateType, Value: "order"}, {Key: meta.AggregateID, Value: "42"},
		{Key: meta.TenantID, Value: "acme"}, {Key: meta.OccurredAt, Value: "2026-11-23T10:00:00.123456Z"},
		{Key: meta.ContentType, Value: "application/json"},
		{Key: "traceparent", Value: traceparent}, {Key: "x-user", Value: "u1"},
	}
	var got []meta.Header
	for _, h := range r.Headers {
		got = append(got, meta.Header{Key: h.Key, Value: string(h.Value)})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("headers\n got %v\nwant %v", got, want)
	}
	// A Go consumer rebuilds the envelope from the record.
	var keys []string
	for _, h := range r.Headers {
		keys = append(keys, h.Key)
	}
	env, err := meta.Envelope(func(k string) string { v, _ := header(r, k); return v }, keys, r.Value)
	if err != nil || env.ID != ids[0] || env.Headers["traceparent"] != traceparent || !env.OccurredAt.Equal(at) {
		t.Fatalf("envelope %+v, %v", env, err)
	}
}

// A rolled-back transaction sends nothing: the event never existed.
func TestRollbackProducesNothing(t *testing.T) {
	c := cluster(t)
	topic := topicName(t)
	createTopic(t, c, topic, nil)
	pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	var calls atomic.Int32
	e := newEngine(t, outbox.Subscription{Name: "to-kafka", Batch: func(ctx context.Context, evs []outbox.Event) error {
		calls.Add(1)
		return pub.Handler()(ctx, evs)
	}}, outbox.Config{})

	rolled := e.publish(t, false, outbox.Envelope{Type: "OrderPlaced", AggregateID: "1", JSON: []byte(`{}`)})
	// An event committed after it: once it is on Kafka, the rolled-back
	// one would have been too.
	ids := e.publish(t, true, outbox.Envelope{Type: "OrderPlaced", AggregateID: "2", JSON: []byte(`{"n":2}`)})
	e.waitFinal(t, 15*time.Second, ids...)
	recs := consume(t, c, topic, 1)
	if n := endOffset(t, c, topic); n != 1 {
		t.Fatalf("%d records on the topic, want only the committed one", n)
	}
	if id, _ := header(recs[0], meta.ID); id != ids[0] {
		t.Fatalf("record %s, want %s", id, ids[0])
	}
	if _, err := e.store.Inspect(context.Background(), rolled[0]); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("rolled-back event stored: %v", err)
	}
}

// An event delivered twice (the process died after Kafka acknowledged it
// and before the done mark was written) is two records: Kafka's
// idempotent producer de-duplicates only its own retries within a
// session. Both carry the same txoutbox-id and key, land on the same
// partition, and are byte-identical; consumers de-duplicate on the id.
func TestRedeliveryIsSameIDAndKey(t *testing.T) {
	c := cluster(t)
	topic := topicName(t)
	createTopic(t, c, topic, nil)
	ctx := context.Background()
	ev := outbox.Event{Envelope: outbox.Envelope{ID: outbox.NewID(), Type: "OrderPlaced", AggregateType: "order",
		AggregateID: "7", OccurredAt: time.Now(), JSON: []byte(`{"id":7}`)}, Attempt: 1}
	// Two clients: the crashed process and the one that took over.
	// The first delivers through the batch handler, the second through
	// Publish, the one-event handler.
	first := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	if err := first.Handler()(ctx, []outbox.Event{ev}); err != nil {
		t.Fatalf("first delivery: %v", err)
	}
	ev.Attempt++
	second := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	if err := second.Publish(ctx, ev); err != nil {
		t.Fatalf("second delivery: %v", err)
	}
	recs := consume(t, c, topic, 2)
	if n := endOffset(t, c, topic); n != 2 {
		t.Fatalf("%d records, want 2 (Kafka does not de-duplicate across producers)", n)
	}
	for _, r := range recs {
		if id, _ := header(r, meta.ID); id != ev.ID || string(r.Key) != "order:7" || r.Partition != recs[0].Partition ||
			!bytes.Equal(r.Value, recs[0].Value) || fmt.Sprint(r.Headers) != fmt.Sprint(recs[0].Headers) {
			t.Fatalf("copies differ: %+v vs %+v", r, recs[0])
		}
	}
}

// An event larger than Kafka accepts is DEAD at the first attempt with a
// reason that says so, whether the client refuses it (over its
// ProducerBatchMaxBytes, about 1 MB by default: a 1 MiB payload) or the
// broker does (over the topic's max.message.bytes).
func TestOversizedIsDeadAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		configs map[string]*string
	}{
		{"client", outbox.MaxPayloadBytes, nil},
		{"broker", 100 << 10, map[string]*string{"max.message.bytes": ptr("65536")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster(t)
			topic := topicName(t)
			createTopic(t, c, topic, tc.configs)
			pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
			e := newEngine(t, outbox.Subscription{Name: "to-kafka", Batch: pub.Handler(), MaxAttempts: 5}, outbox.Config{})
			ids := e.publish(t, true, outbox.Envelope{Type: "Big", AggregateID: "1", Bytes: noise(tc.size)})
			st := e.waitFinal(t, 15*time.Second, ids...)[ids[0]]
			if st.Status != outbox.StatusDead || st.Attempts != 1 {
				t.Fatalf("state %+v, want DEAD after 1 attempt", st)
			}
			if !strings.Contains(st.Err, "larger than Kafka accepts") || !strings.Contains(st.Err, "MESSAGE_TOO_LARGE") {
				t.Fatalf("last error %q does not say why", st.Err)
			}
			if n := endOffset(t, c, topic); n != 0 {
				t.Fatalf("%d records written", n)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// noise returns n bytes that do not compress (the client compresses
// batches: a run of one byte would shrink below any limit).
func noise(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(b)
	return b
}

// A batch gets an outcome per event: among good events, one too large for
// the topic (the broker refuses the whole produce batch it is in: the
// connector produces the refused records again one by one, so that only
// the large one fails) and one whose type makes an invalid topic name.
// Only those two fail, permanently; each good event is written once.
func TestBatchOutcomePerEvent(t *testing.T) {
	c := cluster(t)
	prefix := topicName(t)
	topic := prefix + ".Good"
	createTopic(t, c, topic, map[string]*string{"max.message.bytes": ptr("65536")})
	pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{TopicTemplate: prefix + ".{type}"})

	var evs []outbox.Event
	for i := range 7 {
		env := outbox.Envelope{ID: outbox.NewID(), Type: "Good", AggregateID: "agg", JSON: []byte(fmt.Sprintf(`{"n":%d}`, i))}
		switch i {
		case 2:
			env.JSON, env.Bytes = nil, noise(100<<10)
		case 4:
			env.Type = "bad/type"
		}
		evs = append(evs, outbox.Event{Envelope: env, Attempt: 1})
	}
	err := pub.Handler()(context.Background(), evs)
	var be *outbox.BatchError
	if !errors.As(err, &be) || len(be.Errs) != len(evs) {
		t.Fatalf("got %v, want a BatchError with %d outcomes", err, len(evs))
	}
	for i, e := range be.Errs {
		bad := i == 2 || i == 4
		if (e != nil) != bad {
			t.Fatalf("event %d: %v", i, e)
		}
		if bad && outbox.DefaultClassifier(e) != outbox.DecisionDead {
			t.Fatalf("event %d: %v is not permanent", i, e)
		}
	}
	if !strings.Contains(be.Errs[4].Error(), "invalid Kafka topic name") {
		t.Fatalf("%v", be.Errs[4])
	}
	recs := consume(t, c, topic, 5)
	if n := endOffset(t, c, topic); n != 5 {
		t.Fatalf("%d records, want 5", n)
	}
	var order []string
	for _, r := range recs {
		order = append(order, string(r.Value))
	}
	// The good events of the aggregate stay in order.
	if got := strings.Join(order, " "); got != `{"n":0} {"n":1} {"n":3} {"n":5} {"n":6}` {
		t.Fatalf("records %s", got)
	}
}

// OUTAGE: a steady stream of events while the connection to Kafka is cut
// (a proxy in front of the broker closes every connection and refuses new
// ones) and restored. Nothing is lost, nothing is DEAD, no attempt is
// spent (the connector reports the outage as outbox.Unavailable, which
// opens the circuit), and every event is on the topic after the broker
// comes back.
func TestOutageLosesNothingAndSpendsNoAttempt(t *testing.T) {
	c := cluster(t)
	topic := topicName(t)
	createTopic(t, c, topic, nil)
	proxy := testbroker.NewProxy(t, c.ListenAddrs()[0])
	pub := publisher(t, client(t, proxy.Addr(), proxy.Addr()), kafkaoutbox.Config{Topic: topic})

	var unavailable, failed atomic.Int32
	sawOutage := make(chan struct{})
	var once sync.Once
	e := newEngine(t, outbox.Subscription{
		Name: "to-kafka",
		Batch: func(ctx context.Context, evs []outbox.Event) error {
			err := pub.Handler()(ctx, evs)
			var be *outbox.BatchError
			if errors.As(err, &be) {
				for _, e := range be.Errs {
					if down, _ := outbox.IsUnavailable(e); down {
						unavailable.Add(1)
						once.Do(func() { close(sawOutage) })
					} else if e != nil {
						failed.Add(1)
						t.Errorf("not an outage: %v", e)
					}
				}
			}
			return err
		},
		Timeout:         time.Second,
		MaxAttempts:     2, // a spent attempt would show as DEAD
		CircuitProbe:    100 * time.Millisecond,
		CircuitMaxProbe: 300 * time.Millisecond,
	}, outbox.Config{PollInterval: 50 * time.Millisecond, PollMaxInterval: 200 * time.Millisecond})

	var ids []string
	send := func(n int) {
		for range n {
			ids = append(ids, e.publish(t, true, outbox.Envelope{Type: "Tick", AggregateID: fmt.Sprint(len(ids) % 5),
				JSON: []byte(fmt.Sprintf(`{"n":%d}`, len(ids)))})...)
		}
	}
	send(20)
	e.waitFinal(t, 15*time.Second, ids...)

	proxy.Cut()
	send(20)
	select {
	case <-sawOutage:
	case <-time.After(15 * time.Second):
		t.Fatal("the connector never reported the outage")
	}
	send(20) // the circuit is open: these wait
	proxy.Restore()
	send(20)

	states := e.waitFinal(t, 30*time.Second, ids...)
	for id, st := range states {
		if st.Status != outbox.StatusDone || st.Attempts != 0 {
			t.Fatalf("event %s: %+v, want DONE with no attempt spent", id, st)
		}
	}
	n := endOffset(t, c, topic)
	recs := consume(t, c, topic, int(n))
	seen := map[string]int{}
	for _, r := range recs {
		id, _ := header(r, meta.ID)
		seen[id]++
	}
	for _, id := range ids {
		if seen[id] == 0 {
			t.Fatalf("event %s lost", id)
		}
	}
	t.Logf("%d events, %d records (%d duplicates from redelivery), %d unavailable outcomes, %d other failures",
		len(ids), n, int(n)-len(ids), unavailable.Load(), failed.Load())
}

// A topic that does not exist is retried (attempts spent, then DEAD): a
// configuration error to see, not an outage that parks the subscription.
func TestUnknownTopicIsRetried(t *testing.T) {
	c := cluster(t)
	pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topicName(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := pub.Publish(ctx, outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "x", JSON: []byte(`{}`)}})
	down, _ := outbox.IsUnavailable(err)
	if err == nil || down || outbox.DefaultClassifier(err) == outbox.DecisionDead || !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("got %v (unavailable %v), want a plain retry", err, down)
	}
}

// New checks its options and the client.
func TestNewValidates(t *testing.T) {
	cl := client(t, "127.0.0.1:1", "")
	for _, tc := range []struct {
		name string
		cfg  kafkaoutbox.Config
	}{
		{"no topic", kafkaoutbox.Config{}},
		{"two topics", kafkaoutbox.Config{Topic: "a", TopicTemplate: "b.{type}"}},
		{"bad topic", kafkaoutbox.Config{Topic: "a b"}},
		{"template without placeholder", kafkaoutbox.Config{TopicTemplate: "events"}},
		{"bad template", kafkaoutbox.Config{TopicTemplate: "events/{type}"}},
		{"negative ack timeout", kafkaoutbox.Config{Topic: "a", AckTimeout: -1}},
	} {
		if _, err := kafkaoutbox.New(cl, tc.cfg); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	noIdem := client(t, "127.0.0.1:1", "", kgo.DisableIdempotentWrite())
	if _, err := kafkaoutbox.New(noIdem, kafkaoutbox.Config{Topic: "a"}); err == nil || !strings.Contains(err.Error(), "idempotent") {
		t.Fatalf("a client without idempotent writes: %v", err)
	}
	if _, err := kafkaoutbox.New(cl, kafkaoutbox.Config{TopicTemplate: "events.{type}"}); err != nil {
		t.Fatal(err)
	}
}

// The record carries what the options say.
func TestRecordKeyAndTopic(t *testing.T) {
	cl := client(t, "127.0.0.1:1", "")
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "OrderPlaced", AggregateID: "a", TenantID: "t", Bytes: []byte{0, 1}}}
	pub := publisher(t, cl, kafkaoutbox.Config{TopicTemplate: "ev.{type}"})
	r, err := pub.Record(ev)
	if err != nil || r.Topic != "ev.OrderPlaced" || string(r.Key) != ":a" || !bytes.Equal(r.Value, []byte{0, 1}) {
		t.Fatalf("%+v %v", r, err)
	}
	ev.OrderingKey = "customer:9"
	if r, err = pub.Record(ev); err != nil || string(r.Key) != "customer:9" {
		t.Fatalf("key %q (%v), want the OrderingKey", r.Key, err)
	}
	pub = publisher(t, cl, kafkaoutbox.Config{Topic: "x", Key: kafkaoutbox.AggregateKey})
	if r, err = pub.Record(ev); err != nil || string(r.Key) != "a" {
		t.Fatalf("key %q (%v), want the aggregate id", r.Key, err)
	}
	ev.OrderingKey = ""
	pub = publisher(t, cl, kafkaoutbox.Config{
		TopicFunc: func(ev *outbox.Event) string { return "t-" + ev.TenantID },
		Key:       func(ev *outbox.Event) []byte { return []byte(ev.TenantID) },
	})
	if r, err = pub.Record(ev); err != nil || r.Topic != "t-t" || string(r.Key) != "t" {
		t.Fatalf("%+v %v", r, err)
	}
	ev.AggregateID = ""
	pub = publisher(t, cl, kafkaoutbox.Config{Topic: "x"})
	if r, _ = pub.Record(ev); r.Key != nil {
		t.Fatalf("key %q for an event without aggregate", r.Key)
	}
}

// Errors map onto the outbox's outcomes.
func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{kgo.ErrRecordTimeout, true},
		{fmt.Errorf("x: %w", kerr.NotLeaderForPartition), true},
		{kerr.RequestTimedOut, true},
		{kerr.MessageTooLarge, false},
		{kerr.TopicAuthorizationFailed, false},
		{kerr.UnknownTopicOrPartition, false},
		{kgo.ErrClientClosed, true},
		{errors.New("other"), false},
	} {
		if got := kafkaoutbox.Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%v) = %v", tc.err, got)
		}
	}
}

// An ordered subscription's events reach Kafka in their key's publish
// order: the record key is the ordering key, so a key's records share a
// partition, and the outbox hands over a key's next event only once the
// previous one was acknowledged, so an event whose first attempt fails
// holds its key's later events back instead of being overtaken. Four
// partitions, six keys, fifteen events each, every fourth failing once.
func TestOrderedKeyKeepsOrderInPartition(t *testing.T) {
	topic := topicName(t)
	c := cluster(t, kfake.SeedTopics(4, topic))
	pub := publisher(t, client(t, c.ListenAddrs()[0], ""), kafkaoutbox.Config{Topic: topic})
	type body struct {
		Seq int `json:"seq"`
	}
	var failed atomic.Int64
	flaky := func(ctx context.Context, evs []outbox.Event) error {
		errs := make([]error, len(evs))
		var pass []outbox.Event
		var at []int
		for i, ev := range evs {
			var b body
			if err := json.Unmarshal(ev.JSON, &b); err != nil {
				return outbox.Permanent(err)
			}
			if b.Seq%4 == 1 && ev.Attempt == 1 {
				failed.Add(1)
				errs[i] = errors.New("first attempt fails")
				continue
			}
			pass = append(pass, ev)
			at = append(at, i)
		}
		if len(pass) > 0 {
			err := pub.Handler()(ctx, pass)
			var be *outbox.BatchError
			switch {
			case errors.As(err, &be):
				for j, i := range at {
					errs[i] = be.Errs[j]
				}
			case err != nil:
				for _, i := range at {
					errs[i] = err
				}
			}
		}
		for _, err := range errs {
			if err != nil {
				return &outbox.BatchError{Errs: errs}
			}
		}
		return nil
	}
	e := newEngine(t, outbox.Subscription{Name: "to-kafka", Batch: flaky, Order: outbox.Ordered, BatchSize: 20,
		Retry: outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond })},
		outbox.Config{PollInterval: 50 * time.Millisecond})

	const keys, perKey = 6, 15
	var ids []string
	for seq := range perKey {
		envs := make([]outbox.Envelope, keys)
		for k := range envs {
			envs[k] = outbox.Envelope{Type: "Moved", AggregateType: "acct", AggregateID: fmt.Sprint("k", k),
				JSON: fmt.Appendf(nil, `{"seq":%d}`, seq)}
		}
		ids = append(ids, e.publish(t, true, envs...)...)
	}
	for id, st := range e.waitFinal(t, 30*time.Second, ids...) {
		if st.Status != outbox.StatusDone {
			t.Fatalf("event %s: %+v", id, st)
		}
	}
	if failed.Load() == 0 {
		t.Fatal("no attempt failed: the test proves nothing")
	}
	recs := consume(t, c, topic, keys*perKey)
	partition := map[string]int32{}
	seqs := map[string][]int{}
	for _, r := range recs {
		k := string(r.Key)
		if p, ok := partition[k]; ok && p != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", k, p, r.Partition)
		}
		partition[k] = r.Partition
		var b body
		if err := json.Unmarshal(r.Value, &b); err != nil {
			t.Fatal(err)
		}
		seqs[k] = append(seqs[k], b.Seq)
	}
	if len(seqs) != keys {
		t.Fatalf("keys %v, want %d", seqs, keys)
	}
	for k, got := range seqs {
		if !strings.HasPrefix(k, "acct:k") || len(got) != perKey {
			t.Fatalf("key %s: %v", k, got)
		}
		for i, s := range got {
			if s != i {
				t.Fatalf("key %s: records in order %v, want 0..%d", k, got, perKey-1)
			}
		}
	}
}
