package outbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The core depends on the standard library, the ULID library and its own
// store contract (outbox/driver, itself standard library only) and its
// transaction contract (outbox/txctx, standard library and driver) only.
func TestCoreImportsOnlyStdlibAndULID(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/txoutbox/txoutbox/outbox", "github.com/txoutbox/txoutbox/outbox/driver", "github.com/txoutbox/txoutbox/outbox/txctx", "github.com/oklog/ulid/v2":
		default:
			t.Errorf("outbox imports %s: only the standard library and github.com/oklog/ulid/v2 are allowed", p)
		}
	}
}
