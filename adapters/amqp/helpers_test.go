package amqpoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"

	"github.com/jmoiron/sqlx"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
)

// topology is a test's own exchange and queue on the shared broker,
// deleted when the test ends.
type topology struct {
	url      string
	exchange string
	queue    string
	ch       *amqp.Channel // the test's own, for consuming
}

// unique returns a name unique to this test run.
func unique(t testing.TB, prefix string) string {
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return fmt.Sprintf("txoutbox-test.%s.%s.%s", prefix, name, outbox.NewID()[14:])
}

// newTopology declares a topic exchange and one queue bound to it with
// bindingKey ("" for none).
func newTopology(t testing.TB, bindingKey string) *topology {
	t.Helper()
	url := testbroker.AMQP(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	tp := &topology{url: url, exchange: unique(t, "x"), queue: unique(t, "q"), ch: ch}
	if err := ch.ExchangeDeclare(tp.exchange, "topic", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(tp.queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if bindingKey != "" {
		if err := ch.QueueBind(tp.queue, bindingKey, tp.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// A fresh channel: a test may have broken the first one.
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(tp.queue, false, false, false)
			c.ExchangeDelete(tp.exchange, false, false)
		}
		conn.Close()
	})
	return tp
}

// get waits up to timeout for the next message on the queue.
func (tp *topology) get(t *testing.T, timeout time.Duration) (amqp.Delivery, bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d, ok, err := tp.ch.Get(tp.queue, true)
		if err != nil {
			t.Fatalf("get from %s: %v", tp.queue, err)
		}
		if ok || time.Now().After(deadline) {
			return d, ok
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// count returns the number of messages ready on the queue.
func (tp *topology) count(t *testing.T) int {
	t.Helper()
	q, err := tp.ch.QueueDeclarePassive(tp.queue, false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// env is the outbox of a test: SQLite, one subscription.
type env struct {
	db    *sqlx.DB
	store *sqlstore.Store
	ob    *outbox.Outbox
}

// fastConfig polls often and retries soon, so that tests are quick.
var fastConfig = outbox.Config{
	PollInterval:    20 * time.Millisecond,
	PollMaxInterval: 50 * time.Millisecond,
	SkipRecent:      -1,
	ListenerTimeout: 2 * time.Second,
	Retry:           outbox.RetryFunc(func(int) time.Duration { return 20 * time.Millisecond }),
}

// newEnv starts an outbox on a fresh SQLite table with sub subscribed.
func newEnv(t *testing.T, sub outbox.Subscription) *env {
	t.Helper()
	db := testdb.SQLite(t)
	store := testdb.Store(t, db)
	ob, err := outbox.New(store, fastConfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Subscribe(sub); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ob.Close(ctx); err != nil {
			t.Errorf("outbox close: %v", err)
		}
	})
	return &env{db: db, store: store, ob: ob}
}

// publish publishes envs in one transaction and commits it (or rolls it
// back); it returns their ids.
func (e *env) publish(t *testing.T, commit bool, envs ...outbox.Envelope) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := outbox.BeginTx(ctx, e.db.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(envs))
	for i, env := range envs {
		if ids[i], err = e.ob.PublishTx(ctx, tx, env); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		err = tx.Commit()
	} else {
		err = tx.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// delivery is the state of an event's one subscription.
type delivery struct {
	Status    outbox.Status
	Attempts  int
	LastError string
}

func (e *env) state(t *testing.T, id string) delivery {
	t.Helper()
	rec, err := e.store.Inspect(context.Background(), id)
	if err != nil {
		t.Fatalf("inspect %s: %v", id, err)
	}
	if len(rec.Deliveries) > 0 {
		d := rec.Deliveries[0]
		return delivery{d.Status, d.Attempts, d.LastError}
	}
	return delivery{rec.Status, rec.Attempts, rec.LastError}
}

// await polls until every id is in status want (DONE or DEAD), or fails
// after timeout.
func (e *env) await(t *testing.T, want outbox.Status, timeout time.Duration, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, id := range ids {
		for {
			d := e.state(t, id)
			if d.Status == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %s: %+v after %v; want %v", id, d, timeout, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// newPublisher returns a Publisher closed when the test ends.
func newPublisher(t testing.TB, cfg amqpoutbox.Config) *amqpoutbox.Publisher {
	t.Helper()
	pub, err := amqpoutbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

func isPermanent(err error) bool { return outbox.DefaultClassifier(err) == outbox.DecisionDead }

func isUnavailable(err error) bool { ok, _ := outbox.IsUnavailable(err); return ok }

// outcomes returns the per-event errors of a Publish result for n
// events.
func outcomes(t *testing.T, err error, n int) []error {
	t.Helper()
	if err == nil {
		return make([]error, n)
	}
	var be *outbox.BatchError
	if !errors.As(err, &be) { // one error for the whole batch
		errs := make([]error, n)
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if len(be.Errs) != n {
		t.Fatalf("%d outcomes for %d events", len(be.Errs), n)
	}
	return be.Errs
}
