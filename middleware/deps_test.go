package middleware_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies keeps the package router- and SQL-library-agnostic: it
// may import the standard library and the outbox core, nothing else.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/txoutbox/txoutbox/middleware":    true,
		"github.com/txoutbox/txoutbox/outbox":        true,
		"github.com/txoutbox/txoutbox/outbox/driver": true,
		"github.com/txoutbox/txoutbox/outbox/txctx":  true,
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] && !strings.HasPrefix(p, "github.com/oklog/ulid/") { // the core's own dependency
			t.Errorf("middleware depends on %s; it may import only the standard library and outbox", p)
		}
	}
}
