package testdb

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A database suite that skips (no server, TXOUTBOX_REQUIRE_DB unset) is
// listed in TXOUTBOX_SKIP_LOG, which make test prints at the end.
func TestSkippedSuiteIsListed(t *testing.T) {
	log := filepath.Join(t.TempDir(), "skipped")
	t.Setenv("TXOUTBOX_SKIP_LOG", log)
	t.Setenv("TXOUTBOX_REQUIRE_DB", "")
	t.Run("unreachable", func(t *testing.T) {
		open(t, "mysql", "root@tcp(127.0.0.1:1)/test?timeout=1s", "MariaDB/MySQL", "TXOUTBOX_MYSQL_DSN")
		t.Error("open returned for an unreachable server")
	})
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatalf("no skip log: %v", err)
	}
	if line := string(b); !strings.Contains(line, "skipped: MariaDB/MySQL tests in") || !strings.Contains(line, "TXOUTBOX_MYSQL_DSN") {
		t.Fatalf("skip log %q", line)
	}
}
