package inbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The inbox is part of the core: the standard library, the outbox and its
// middleware package, and what they import (ULID).
func TestImportsOnlyCore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/txoutbox/txoutbox/inbox", "github.com/txoutbox/txoutbox/outbox", "github.com/txoutbox/txoutbox/outbox/driver", "github.com/txoutbox/txoutbox/outbox/txctx",
			"github.com/txoutbox/txoutbox/middleware", "github.com/oklog/ulid/v2":
		default:
			t.Errorf("inbox imports %s: only the standard library, the outbox core and github.com/oklog/ulid/v2 are allowed", p)
		}
	}
}
