package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/txoutbox/txoutbox/internal/testdb"
)

// guard bounds each wait on the program, so that a broken quick start
// fails the test instead of hanging it. It is not a timed assertion.
const guard = 2 * time.Minute

// TestREADMEQuickStartRuns builds the README's quick-start Go block as
// printed, in a module of its own that reaches this repository through a
// replace, runs it on SQLite, posts an order, sees the event delivered,
// stops the program with SIGTERM, and expects it to shut down cleanly
// (exit 0) after delivering.
func TestREADMEQuickStartRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program: not in -short")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := quickStartBlock(t, string(readme))
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", src)
	write("go.mod", "module quickstart\n\ngo 1.26.0\n\nrequire github.com/txoutbox/txoutbox v0.0.0\n\nreplace github.com/txoutbox/txoutbox => "+repo+"\n")
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum")) // the versions the repository uses
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("mod", "tidy")
	bin := filepath.Join(dir, "quickstart")
	gocmd("build", "-o", bin, ".")

	addr := freeAddr(t)
	cmd := exec.Command(bin)
	cmd.Dir = t.TempDir() // quickstart.db goes there
	cmd.Env = append(os.Environ(), "ADDR="+addr)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() }) // if the test fails midway
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var output []string
	await := func(what string) {
		t.Helper()
		deadline := time.After(guard)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the program ended before %q; its output:\n%s", what, strings.Join(output, "\n"))
				}
				output = append(output, l)
				if strings.Contains(l, what) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q within %v; output:\n%s", what, guard, strings.Join(output, "\n"))
			}
		}
	}
	await("listening on " + addr)

	resp, err := http.Post("http://"+addr+"/orders/1", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders/1: %s, want 201", resp.Status)
	}
	await("deliver OrderPlaced ")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	await("shutting down")
	for l := range lines { // to the end of its output
		output = append(output, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0; output:\n%s", err, strings.Join(output, "\n"))
	}
}

// quickStartBlock returns the first Go block of the README's quick start.
func quickStartBlock(t *testing.T, readme string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		t.Fatal("README.md has no \"## Quick start\" section")
	}
	_, rest, ok = strings.Cut(rest, "```go\n")
	if !ok {
		t.Fatal("the quick start has no Go block")
	}
	src, _, ok := strings.Cut(rest, "```\n")
	if !ok {
		t.Fatal("the quick start's Go block does not end")
	}
	return src
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr())
}

// The quick start's business table, as printed, works on each database
// its comments suggest (a TEXT primary key failed on MariaDB with Error
// 1170), and takes the order its handler inserts.
func TestQuickStartTableWorksOnEveryDatabase(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src := quickStartBlock(t, string(readme))
	_, ddl, ok := strings.Cut(src, "db.MustExec(`")
	if ok {
		ddl, _, ok = strings.Cut(ddl, "`")
	}
	if !ok || !strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS orders ") {
		t.Fatal("no CREATE TABLE orders in the quick start")
	}
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			db := testdb.Open(t, name)
			table := testdb.TableName("qs_orders")
			if _, err := db.Exec(strings.Replace(ddl, " orders ", " "+table+" ", 1)); err != nil {
				t.Fatalf("%s: %v", ddl, err)
			}
			t.Cleanup(func() { testdb.DropTable(t, db, table) })
			if _, err := db.Exec(db.Rebind("INSERT INTO "+table+" (id, item) VALUES (?, 'book')"), "1"); err != nil {
				t.Fatal(err)
			}
		})
	}
}
