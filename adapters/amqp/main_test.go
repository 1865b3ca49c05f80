package amqpoutbox_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
)

// TestMain fails the run if a goroutine of the Publisher, the outbox or
// the AMQP client (a connection left open) outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakcheck.Wait(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running txoutbox code after the tests:\n%s\n", leaked)
			code = 1
		} else if leaked := amqpGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines of the AMQP client still running (a connection left open):\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func amqpGoroutines(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var out []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "rabbitmq/amqp091-go") {
				out = append(out, g)
			}
		}
		if len(out) == 0 || time.Now().After(deadline) {
			return strings.Join(out, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
