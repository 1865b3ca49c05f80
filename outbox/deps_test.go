package outbox

import (
	"os/exec"
	"strings"
	"testing"
)

// The core depends on the standard library and the ULID library only.
func TestCoreImportsOnlyStdlibAndULID(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/txoutbox/txoutbox/outbox" && p != "github.com/oklog/ulid/v2" {
			t.Errorf("outbox imports %s: only the standard library and github.com/oklog/ulid/v2 are allowed", p)
		}
	}
}
