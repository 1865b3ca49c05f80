package redisoutbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txoutbox/txoutbox/outbox"
)

func TestTemplate(t *testing.T) {
	ev := &outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "OrderPlaced", AggregateType: "order", TenantID: "acme"}}
	for _, c := range []struct{ tmpl, want, err string }{
		{"events", "events", ""},
		{"events:${type}", "events:OrderPlaced", ""},
		{"{${tenant}}:${aggregate_type}:${type}", "{acme}:order:OrderPlaced", ""},
		{"cost$$:${type}", "cost$:OrderPlaced", ""},
		{"", "", "empty stream key"},
		{"events:${id}", "", "unknown placeholder ${id}"},
		{"events:${type", "", "unclosed ${"},
		{"events:$type", "", "does not start a ${placeholder}"},
		{"events:$", "", "does not start a ${placeholder}"},
	} {
		tm, err := parseTemplate(c.tmpl)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want %q", c.tmpl, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.tmpl, err)
			continue
		}
		if got, err := tm.expand(ev); got != c.want || err != nil {
			t.Errorf("%q: %q, %v; want %q", c.tmpl, got, err, c.want)
		}
	}
	tm, _ := parseTemplate("t:${tenant}")
	if _, err := tm.expand(&outbox.Event{Envelope: outbox.Envelope{ID: "1", Type: "T"}}); err == nil || !strings.Contains(err.Error(), "has no tenant") {
		t.Errorf("empty placeholder: %v", err)
	}
}

func TestNewChecksOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, c := range []struct {
		cfg Config
		err string
	}{
		{Config{Stream: "a", StreamTemplate: "b:${type}"}, "at most one of"},
		{Config{StreamTemplate: "x:${nope}"}, "unknown placeholder"},
		{Config{MaxLen: -1}, "MaxLen -1"},
		{Config{MaxMessageBytes: -1}, "MaxMessageBytes -1"},
		{Config{PayloadField: "txoutbox-id"}, "is a metadata field"},
		{Config{IdempotentTTL: time.Microsecond}, "under a millisecond"},
	} {
		if _, err := New(rdb, c.cfg); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%v, want %q", err, c.err)
		}
	}
	if _, err := New(nil, Config{}); err == nil {
		t.Error("nil client accepted")
	}
	// A fixed key is literal, '$' included.
	p, err := New(rdb, Config{Stream: "a$b"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := p.stream.expand(&outbox.Event{}); got != "a$b" {
		t.Errorf("fixed key %q", got)
	}
}

// The marker of Idempotent mode is in the stream's cluster slot.
func TestDedupKeySlot(t *testing.T) {
	p := &Publisher{}
	for _, c := range []struct{ stream, key, tag string }{
		{"events", "{events}:txoutbox-dedup:X", "events"},
		{"{app}:events", "{app}:events:txoutbox-dedup:X", "app"},
		{"a{b", "{a{b}:txoutbox-dedup:X", "a{b"},
		{"a{}b", "a{}b:txoutbox-dedup:X", ""}, // has '}': documented limit
	} {
		k := p.DedupKey(c.stream, "X")
		if k != c.key {
			t.Errorf("DedupKey(%q) = %q, want %q", c.stream, k, c.key)
		}
		if tag, _ := hashTag(k); c.tag != "" && tag != c.tag {
			t.Errorf("%q: tag %q, want %q", k, tag, c.tag)
		}
	}
}

type redisErr string

func (e redisErr) Error() string { return string(e) }
func (e redisErr) RedisError()   {}

func TestUnreachable(t *testing.T) {
	// A real dial error: nothing listens on port 1.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	dialErr := rdb.Ping(context.Background()).Err()
	closed := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	closed.Close()
	closedErr := closed.Ping(context.Background()).Err()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{dialErr, true},
		{closedErr, true},
		{io.EOF, true},
		{fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{context.DeadlineExceeded, true},
		{redis.ErrPoolTimeout, true},
		{&net.OpError{Op: "read", Err: errors.New("i/o timeout")}, true},
		{redisErr("LOADING Redis is loading the dataset in memory"), true},
		{redisErr("READONLY You can't write against a read only replica."), true},
		{redisErr("MASTERDOWN Link with MASTER is down"), true},
		{redisErr("CLUSTERDOWN The cluster is down"), true},
		{redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{redisErr("BUSY Redis is busy running a script."), true},
		{redisErr("ERR max number of clients reached"), true},
		{redisErr("OOM command not allowed when used memory > 'maxmemory'."), false},
		{redisErr("NOPERM this user has no permissions to run the 'xadd' command"), false},
		{redisErr("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{errors.New("something else"), false},
		{nil, false},
	} {
		if got := Unreachable(c.err); got != c.want {
			t.Errorf("Unreachable(%v) = %v, want %v", c.err, got, c.want)
		}
		if c.err == nil {
			continue
		}
		down, _ := outbox.IsUnavailable(classify("s", c.err))
		if down != c.want {
			t.Errorf("classify(%v) unavailable = %v", c.err, down)
		}
	}
}
