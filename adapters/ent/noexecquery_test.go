package entoutbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ent code generated without sql/execquery fails to compile with an error
// that names what is missing (GeneratedWithExecQuery, ExecContext): the
// README's troubleshooting entry starts from that text.
func TestWithoutExecQueryTheCompilerNamesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the compiler")
	}
	dir, err := os.MkdirTemp(".", "noexecquery")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	src := `package noexecquery

import (
	"context"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
)

// Tx is what ent generates without sql/execquery: no ExecContext.
type Tx struct{}

type Committer interface{ Commit(context.Context, *Tx) error }
type CommitHook func(Committer) Committer
type Rollbacker interface{ Rollback(context.Context, *Tx) error }
type RollbackHook func(Rollbacker) Rollbacker

func (*Tx) OnCommit(CommitHook)     {}
func (*Tx) OnRollback(RollbackHook) {}
func (*Tx) Commit() error           { return nil }
func (*Tx) Rollback() error         { return nil }

var _ = entoutbox.Wrap[*Tx]
`
	if err := os.WriteFile(filepath.Join(dir, "tx.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "build", "./"+filepath.Base(dir)).CombinedOutput()
	if err == nil {
		t.Fatal("code without ExecContext compiled")
	}
	for _, want := range []string{"GeneratedWithExecQuery", "missing method ExecContext"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("compiler output does not mention %q:\n%s", want, out)
		}
	}
}
