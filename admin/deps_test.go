package admin_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The admin package is the standard library on top of the outbox: no
// router, no template engine, no JavaScript build.
func TestImportsOnlyStdlibAndOutbox(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/txoutbox/txoutbox/admin", "github.com/txoutbox/txoutbox/outbox", "github.com/txoutbox/txoutbox/outbox/driver", "github.com/txoutbox/txoutbox/outbox/txctx", "github.com/oklog/ulid/v2",
			"github.com/txoutbox/txoutbox/inbox", "github.com/txoutbox/txoutbox/middleware": // the inbox: standard library and the outbox too
		default:
			t.Errorf("admin imports %s: only the standard library and the outbox are allowed", p)
		}
	}
}
