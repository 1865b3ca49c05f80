package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/txoutbox/txoutbox/inbox"
)

// A poison message is parked after MaxAttempts failures with its payload,
// headers and last error, and settled; a redelivery of it is a Duplicate;
// Replay with a handler that still fails keeps it parked with the new
// error, and with one that works applies it once.
func TestPoisonParkedThenReplayed(t *testing.T) {
	eachDB(t, inbox.Config{MaxAttempts: 3}, func(t *testing.T, e *env) {
		ctx := context.Background()
		m := inbox.Message{ID: "poison", Payload: []byte{0, 1, 2, 0xff}, Headers: map[string]string{"txoutbox-type": "order.placed", "k": "v"}}
		for i := 1; i <= 3; i++ {
			res, err := e.ib.Handle(ctx, "c", m, e.failing(fmt.Errorf("bad thing %d", i)))
			want := inbox.Failed
			if i == 3 {
				want = inbox.Parked
			}
			if res != want || err == nil {
				t.Fatalf("attempt %d: %v %v, want %v with the handler's error", i, res, err, want)
			}
		}
		if !inbox.Parked.Settled() {
			t.Error("Parked is not Settled: the broker would redeliver a parked message forever")
		}
		e.wantEffects(t, "poison", 0, 0, 1)
		res, err := e.ib.Handle(ctx, "c", m, func(context.Context, inbox.Message) error {
			t.Error("handler called for a parked message")
			return nil
		})
		mustResult(t, res, err, inbox.Duplicate)
		if n := e.count(t, "SELECT COUNT(*) FROM "+e.store.InboxFailuresTable()); n != 0 {
			t.Errorf("%d failure rows after parking, want 0", n)
		}

		entries, err := e.ib.Parked(ctx, inbox.ParkedFilter{Consumer: "c"})
		if err != nil || len(entries) != 1 {
			t.Fatalf("Parked: %v %v, want one entry", entries, err)
		}
		got := entries[0]
		if got.Consumer != "c" || got.Message.ID != "poison" || string(got.Message.Payload) != string(m.Payload) ||
			!maps.Equal(got.Message.Headers, m.Headers) || got.Attempts != 3 || got.LastError != "bad thing 3" || got.ReceivedAt.IsZero() {
			t.Errorf("parked entry %+v, want the message, 3 attempts and the last error", got)
		}

		res, err = e.ib.Replay(ctx, "c", "poison", e.failing(errors.New("still bad")))
		if res != inbox.Parked || err == nil {
			t.Fatalf("failing replay: %v %v, want Parked with the error", res, err)
		}
		entries, _ = e.ib.Parked(ctx, inbox.ParkedFilter{})
		if len(entries) != 1 || entries[0].LastError != "still bad" || entries[0].Attempts != 4 || string(entries[0].Message.Payload) != string(m.Payload) {
			t.Errorf("after a failing replay: %+v, want still parked, 4 attempts, last error \"still bad\"", entries)
		}
		e.wantEffects(t, "poison", 0, 0, 1)

		var replayed inbox.Message
		res, err = e.ib.Replay(ctx, "c", "poison", func(ctx context.Context, m inbox.Message) error {
			replayed = m
			return e.apply(ctx, m)
		})
		mustResult(t, res, err, inbox.Applied)
		if string(replayed.Payload) != string(m.Payload) || !maps.Equal(replayed.Headers, m.Headers) {
			t.Errorf("replayed message %+v, want the parked one", replayed)
		}
		e.wantEffects(t, "poison", 1, 1, 1)
		if entries, _ := e.ib.Parked(ctx, inbox.ParkedFilter{}); len(entries) != 0 {
			t.Errorf("still parked after a replay: %+v", entries)
		}
		if _, err := e.ib.Replay(ctx, "c", "poison", e.apply); !errors.Is(err, inbox.ErrNotParked) {
			t.Errorf("second replay: %v, want ErrNotParked", err)
		}
		res, err = e.ib.Handle(ctx, "c", m, e.apply)
		mustResult(t, res, err, inbox.Duplicate)
		e.wantEffects(t, "poison", 1, 1, 1)
	})
}

// Purge drops a parked message's payload and headers; its row still
// dedupes, so a late redelivery is a Duplicate, and it no longer lists.
// The listing pages in (consumer, id) order.
func TestParkedListPurge(t *testing.T) {
	eachDB(t, inbox.Config{MaxAttempts: 1}, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, k := range []string{"b/2", "a/1", "b/1", "a/2"} {
			consumer, id, _ := strings.Cut(k, "/")
			res, err := e.ib.Handle(ctx, consumer, inbox.Message{ID: id, Payload: []byte(k)}, e.failing(errBoom))
			if res != inbox.Parked {
				t.Fatalf("%s: %v %v, want Parked", k, res, err)
			}
		}
		var seen []string
		f := inbox.ParkedFilter{Limit: 3}
		for {
			page, err := e.ib.Parked(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range page {
				seen = append(seen, p.Consumer+"/"+p.Message.ID)
			}
			if len(page) < f.Limit {
				break
			}
			f.AfterConsumer, f.AfterID = page[len(page)-1].Consumer, page[len(page)-1].Message.ID
		}
		if strings.Join(seen, ",") != "a/1,a/2,b/1,b/2" {
			t.Errorf("parked pages: %v", seen)
		}
		n, err := e.ib.Purge(ctx, "a", "1", "2", "missing")
		if err != nil || n != 2 {
			t.Fatalf("Purge: %d %v, want 2", n, err)
		}
		if left, _ := e.ib.Parked(ctx, inbox.ParkedFilter{}); len(left) != 2 || left[0].Consumer != "b" {
			t.Errorf("after purge: %+v, want b's two", left)
		}
		res, err := e.ib.Handle(ctx, "a", inbox.Message{ID: "1"}, e.apply)
		mustResult(t, res, err, inbox.Duplicate)
		if n := e.count(t, "SELECT COUNT(*) FROM "+e.store.InboxTable()+" WHERE payload IS NOT NULL AND consumer = 'a'"); n != 0 {
			t.Errorf("%d purged rows kept their payload", n)
		}
		if _, err := e.ib.Replay(ctx, "a", "1", e.apply); !errors.Is(err, inbox.ErrNotParked) {
			t.Errorf("replay of a purged message: %v, want ErrNotParked", err)
		}
	})
}

// Cleanup removes only applied and purged rows older than the retention,
// and old failure counts, in batches; parked rows stay. A message whose
// row was removed is applied again, as documented.
func TestCleanupRemovesOnlyOldRows(t *testing.T) {
	eachDB(t, inbox.Config{Retention: 3600e9, CleanupBatch: 2, MaxAttempts: 2}, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, id := range []string{"old1", "old2", "old3", "young"} {
			res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: id}, e.apply)
			mustResult(t, res, err, inbox.Applied)
		}
		for _, id := range []string{"oldparked", "oldpurged"} {
			for range 2 {
				e.ib.Handle(ctx, "c", inbox.Message{ID: id}, e.failing(errBoom))
			}
		}
		e.ib.Purge(ctx, "c", "oldpurged")
		e.ib.Handle(ctx, "c", inbox.Message{ID: "oldfail"}, e.failing(errBoom))
		e.ib.Handle(ctx, "c", inbox.Message{ID: "youngfail"}, e.failing(errBoom))
		for _, id := range []string{"old1", "old2", "old3", "oldparked", "oldpurged"} {
			e.age(t, id, false)
		}
		e.age(t, "oldfail", true)

		n, err := e.ib.Cleanup(ctx)
		if err != nil || n != 5 {
			t.Fatalf("Cleanup: %d %v, want 5 rows (old1-3, oldpurged, oldfail)", n, err)
		}
		var left []string
		if err := e.db.Select(&left, "SELECT message_id FROM "+e.store.InboxTable()+" ORDER BY message_id"); err != nil {
			t.Fatal(err)
		}
		if strings.Join(left, ",") != "oldparked,young" {
			t.Errorf("inbox rows after cleanup: %v, want oldparked,young", left)
		}
		if err := e.db.Select(&left, "SELECT message_id FROM "+e.store.InboxFailuresTable()); err != nil {
			t.Fatal(err)
		}
		if strings.Join(left, ",") != "youngfail" {
			t.Errorf("failure rows after cleanup: %v, want youngfail", left)
		}
		res, err := e.ib.Handle(ctx, "c", inbox.Message{ID: "young"}, e.apply)
		mustResult(t, res, err, inbox.Duplicate)
		res, err = e.ib.Handle(ctx, "c", inbox.Message{ID: "old1"}, func(context.Context, inbox.Message) error { return nil })
		mustResult(t, res, err, inbox.Applied)
	})
}
