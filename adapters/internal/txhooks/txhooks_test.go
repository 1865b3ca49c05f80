package txhooks

import (
	"errors"
	"slices"
	"testing"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		q    string
		op   Op
		name string
	}{
		{"SAVEPOINT sp1", OpSavepoint, "sp1"},
		{"  savepoint `Sp1`;", OpSavepoint, "Sp1"},
		{"SAVEPOINT SP1", OpSavepoint, "sp1"},
		{"ROLLBACK TO SAVEPOINT sp1", OpRollbackTo, "sp1"},
		{"rollback to sp1", OpRollbackTo, "sp1"},
		{"ROLLBACK WORK TO SAVEPOINT \"a\"", OpRollbackTo, "a"},
		{"ROLLBACK TRANSACTION TO a", OpRollbackTo, "a"},
		{"RELEASE SAVEPOINT sp1", OpRelease, "sp1"},
		{"release sp1", OpRelease, "sp1"},
		{"ROLLBACK", 0, ""},
		{"ROLLBACK TO", 0, ""},
		{"SAVEPOINT", 0, ""},
		{"SELECT 1", 0, ""},
		{"RELEASE SAVEPOINT a b", 0, ""},
		{"INSERT INTO savepoint VALUES (1)", 0, ""},
		{"", 0, ""},
	} {
		op, name, ok := Parse(tc.q)
		if ok != (tc.op != 0) || op != tc.op || name != tc.name {
			t.Errorf("Parse(%q) = %v, %q, %v; want %v, %q", tc.q, op, name, ok, tc.op, tc.name)
		}
	}
}

type recorder struct{ got []string }

func (r *recorder) hook(s string) func() { return func() { r.got = append(r.got, s) } }

func TestSavepoints(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit bool
		want   []string
	}{
		{"commit", true, []string{"c0", "r-sp1", "c-sp2", "c-after"}},
		{"rollback", false, []string{"r0", "r-sp1", "r-sp2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Hooks
			var r recorder
			h.AfterCommit(r.hook("c0"))
			h.AfterRollback(r.hook("r0"))
			Observe(&h, "SAVEPOINT sp1")
			h.AfterCommit(r.hook("c-sp1"))
			h.AfterRollback(r.hook("r-sp1"))
			Observe(&h, "SAVEPOINT inner")
			h.AfterCommit(r.hook("c-inner"))
			Observe(&h, "ROLLBACK TO SAVEPOINT sp1") // drops c-sp1 and c-inner, and "inner"
			if d := h.Depth(); d != 1 {
				t.Fatalf("depth after rollback to sp1 = %d, want 1", d)
			}
			Observe(&h, "SAVEPOINT sp2")
			h.AfterCommit(r.hook("c-sp2"))
			h.AfterRollback(r.hook("r-sp2"))
			Observe(&h, "RELEASE SAVEPOINT sp2") // merged into sp1's level
			Observe(&h, "RELEASE SAVEPOINT sp1")
			if h.RollbackToSavepoint("sp2") {
				t.Fatal("RollbackTo a released savepoint reported it known")
			}
			h.AfterCommit(r.hook("c-after"))
			var err error
			if tc.commit {
				err = h.Committed()
			} else {
				err = h.RolledBack()
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(r.got, tc.want) {
				t.Fatalf("ran %v, want %v", r.got, tc.want)
			}
			if h.Committed() != nil || h.RolledBack() != nil || len(r.got) != len(tc.want) {
				t.Fatal("a second Committed/RolledBack ran hooks")
			}
			h.AfterCommit(r.hook("late"))
			if h.Committed(); len(r.got) != len(tc.want) {
				t.Fatal("a hook registered after the outcome ran")
			}
		})
	}
}

func TestRepeatedNamesAreAStack(t *testing.T) {
	var h Hooks
	var r recorder
	h.Savepoint("a")
	h.AfterCommit(r.hook("outer-a"))
	h.Savepoint("a")
	h.AfterCommit(r.hook("inner-a"))
	h.RollbackToSavepoint("a") // the most recent a
	h.Committed()
	if want := []string{"outer-a"}; !slices.Equal(r.got, want) {
		t.Fatalf("ran %v, want %v", r.got, want)
	}
}

func TestPanickingHook(t *testing.T) {
	var h Hooks
	var r recorder
	h.AfterCommit(func() { panic("boom") })
	h.AfterCommit(r.hook("second"))
	err := h.Committed()
	var pe *txctx.PanicError
	if !errors.As(err, &pe) || pe.Index != 0 || pe.Value != "boom" {
		t.Fatalf("err = %v, want a txctx.PanicError for hook 0", err)
	}
	if want := []string{"second"}; !slices.Equal(r.got, want) {
		t.Fatalf("ran %v, want %v", r.got, want)
	}
}
