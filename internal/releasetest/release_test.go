package releasetest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// version is the version the nested modules require the root at; the
// test publishes every library module at it.
const version = "v0.1.0"

// The library modules users go get, by directory.
var libraries = map[string]string{
	".":             "github.com/txoutbox/txoutbox",
	"adapters/gorm": "github.com/txoutbox/txoutbox/adapters/gorm",
	"adapters/ent":  "github.com/txoutbox/txoutbox/adapters/ent",
}

// A user's module, outside the repository, with no replace and no
// workspace, gets the root and the adapters from a module proxy at
// version, builds the README's quick start and a GORM program, and
// publishes and delivers an event on SQLite.
func TestModulesResolveFromAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module proxy and a user module: not in -short")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").CombinedOutput(); err != nil {
		t.Skipf("not a git checkout (%v: %s): the proxy is built from the committed tree", err, out)
	}
	proxy := t.TempDir()
	for dir, path := range libraries {
		publish(t, proxy, repo, dir, path)
	}

	user := t.TempDir()
	write(t, filepath.Join(user, "go.mod"), "module example.com/shop\n\ngo 1.26.0\n")
	// Checksums of the third-party modules, as the repository has them:
	// this machine cannot reach the checksum database.
	var sums bytes.Buffer
	for dir := range libraries {
		b, err := os.ReadFile(filepath.Join(repo, dir, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sums.Write(b)
	}
	write(t, filepath.Join(user, "go.sum"), sums.String())
	quick, err := os.ReadFile(filepath.Join(repo, "examples/quickstart/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(user, "cmd/quickstart/main.go"), string(quick))
	write(t, filepath.Join(user, "cmd/gormshop/main.go"), gormProgram)
	write(t, filepath.Join(user, "cmd/deliver/main.go"), deliverProgram)

	env := append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod",
		"GOPROXY=file://"+filepath.ToSlash(proxy)+","+goEnv(t, "GOPROXY"),
		"GONOSUMDB=github.com/txoutbox",
		"GONOSUMCHECK=1",
		"GOSUMDB=off",
		"GOPRIVATE=",
	)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = user, env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("go %s (%v)", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("get", "github.com/txoutbox/txoutbox@"+version, "github.com/txoutbox/txoutbox/adapters/gorm@"+version, "github.com/txoutbox/txoutbox/adapters/ent@"+version)
	gomod, _ := os.ReadFile(filepath.Join(user, "go.mod"))
	if strings.Contains(string(gomod), "replace") || !strings.Contains(string(gomod), "github.com/txoutbox/txoutbox/adapters/gorm "+version) {
		t.Fatalf("the user's go.mod:\n%s", gomod)
	}
	run("build", "./...")
	if out := run("run", "./cmd/deliver"); !strings.Contains(out, "delivered OrderPlaced") {
		t.Fatalf("publish and deliver printed:\n%s", out)
	}
	if out := run("run", "./cmd/gormshop"); !strings.Contains(out, "delivered order.placed") {
		t.Fatalf("the GORM program printed:\n%s", out)
	}
}

// publish writes module path, from dir of the repository at HEAD, to the
// file proxy at version.
func publish(t *testing.T, proxy, repo, dir, path string) {
	t.Helper()
	mv := module.Version{Path: path, Version: version}
	base := filepath.Join(proxy, filepath.FromSlash(path), "@v")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(base, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	subdir := dir
	if subdir == "." {
		subdir = ""
	}
	if err := zip.CreateFromVCS(f, mv, repo, "HEAD", subdir); err != nil {
		t.Fatalf("zip %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := exec.Command("git", "-C", repo, "show", "HEAD:"+strings.TrimPrefix(filepath.ToSlash(filepath.Join(dir, "go.mod")), "./")).Output()
	if err != nil {
		t.Fatalf("go.mod of %s at HEAD: %v", path, err)
	}
	write(t, filepath.Join(base, version+".mod"), string(gomod))
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	write(t, filepath.Join(base, version+".info"), string(info))
	write(t, filepath.Join(base, "list"), version+"\n")
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func goEnv(t *testing.T, key string) string {
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

const gormProgram = `package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	_ "modernc.org/sqlite"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

type Order struct {
	ID       uint
	Customer string
}

func main() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "gormshop")
	defer os.RemoveAll(dir)
	sqlDB, err := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "shop.db")))
	if err != nil {
		log.Fatal(err)
	}
	db, err := gorm.Open(sqlite.Dialector{Conn: sqlDB}, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(&gormoutbox.Plugin{}); err != nil {
		log.Fatal(err)
	}
	db.AutoMigrate(&Order{})
	store := sqlstore.Must(sqlstore.New(sqlx.NewDb(sqlDB, "sqlite"), sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	got := make(chan outbox.Event, 1)
	ob.Handle("print", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, "order.placed")
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ob.Close(ctx)
	err = db.WithContext(outbox.NewContext(ctx, ob)).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Customer: "ada"}).Error; err != nil {
			return err
		}
		_, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "order.placed", JSON: []byte(` + "`" + `{"customer":"ada"}` + "`" + `)})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	select {
	case ev := <-got:
		fmt.Println("delivered", ev.Type, ev.ID)
	case <-time.After(10 * time.Second):
		log.Fatal("not delivered")
	}
}
`

const deliverProgram = `package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

func main() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "deliver")
	defer os.RemoveAll(dir)
	db := sqlx.MustOpen("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "shop.db")))
	store := sqlstore.Must(sqlstore.New(db, sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(store, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	got := make(chan outbox.Event, 1)
	ob.Handle("print", func(_ context.Context, ev outbox.Event) error { got <- ev; return nil }, "OrderPlaced")
	if err := ob.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer ob.Close(ctx)
	tx, err := outbox.BeginTx(ctx, db.DB, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ob.PublishTx(ctx, tx, outbox.Envelope{Type: "OrderPlaced", JSON: []byte(` + "`" + `{"id":1}` + "`" + `)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	select {
	case ev := <-got:
		fmt.Println("delivered", ev.Type, ev.ID)
	case <-time.After(10 * time.Second):
		log.Fatal("not delivered")
	}
}
`
