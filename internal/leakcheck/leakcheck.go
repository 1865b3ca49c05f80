// Package leakcheck fails a test binary that leaves goroutines running in
// txoutbox code after its tests end.
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// ours marks goroutines to look at: any with a frame in this module, other
// than this package and the test binary's own main.
const ours = "github.com/txoutbox/txoutbox/"

// Main runs the tests, then waits up to five seconds for every goroutine
// running txoutbox code to end, and exits non-zero, listing their stacks,
// if some remain.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := Wait(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines still running txoutbox code after the tests:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// Wait polls until no goroutine runs txoutbox code or the timeout passes,
// and returns the stacks of those left ("" if none).
func Wait(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		leaked := Leaked()
		if leaked == "" || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Leaked returns the stacks of goroutines other than the caller's that run
// txoutbox code.
func Leaked() string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		if i == 0 { // the calling goroutine
			continue
		}
		if !strings.Contains(g, ours) {
			continue
		}
		if strings.Contains(g, ours+"internal/leakcheck") || strings.Contains(g, "testing.(*M).Run") || strings.Contains(g, "testing.tRunner") {
			continue
		}
		out = append(out, g)
	}
	return strings.Join(out, "\n\n")
}
