package releasetest

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// version is the version the nested modules require the root at; the
// test publishes every library module at it.
const version = "v0.1.0"

// The library modules users go get, by directory: the root, the
// transaction adapters, the connectors and the tracing interceptor (see
// RELEASING.md's tags).
var libraries = map[string]string{
	".":                "github.com/txoutbox/txoutbox",
	"adapters/gorm":    "github.com/txoutbox/txoutbox/adapters/gorm",
	"adapters/ent":     "github.com/txoutbox/txoutbox/adapters/ent",
	"adapters/nats":    "github.com/txoutbox/txoutbox/adapters/nats",
	"adapters/amqp":    "github.com/txoutbox/txoutbox/adapters/amqp",
	"adapters/kafka":   "github.com/txoutbox/txoutbox/adapters/kafka",
	"adapters/redis":   "github.com/txoutbox/txoutbox/adapters/redis",
	"adapters/webhook": "github.com/txoutbox/txoutbox/adapters/webhook",
	"adapters/otel":    "github.com/txoutbox/txoutbox/adapters/otel",
}

// examples are the connectors' runnable programs (examples/NAME/main.go):
// the user's module builds each against the published modules. They are
// not run: all but kafka's need a broker.
var examples = []string{"amqp", "kafka", "nats", "otel", "redis", "webhook"}

// A user's module, outside the repository, with no replace and no
// workspace, gets the root, the adapters and the connectors from a module
// proxy at version, builds the README's quick start, a GORM program and
// every connector's example, and publishes and delivers an event on
// SQLite.
func TestModulesResolveFromAProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module proxy and a user module: not in -short")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	head, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").CombinedOutput()
	if err != nil {
		t.Skipf("not a git checkout (%v: %s): the proxy is built from the committed tree", err, head)
	}
	rev := strings.TrimSpace(string(head))
	// zip.CreateFromVCS recognises only a directory whose .git is the
	// repository: not a linked worktree (git worktree add), where .git is
	// a file. A shared clone (objects borrowed, no checkout) is one.
	clone := filepath.Join(t.TempDir(), "repo")
	if out, err := exec.Command("git", "clone", "--quiet", "--shared", "--no-checkout", repo, clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone --shared: %v\n%s", err, out)
	}
	proxy := t.TempDir()
	for dir, path := range libraries {
		publish(t, proxy, clone, rev, dir, path)
	}

	user := t.TempDir()
	write(t, filepath.Join(user, "go.mod"), "module example.com/shop\n\ngo 1.26.0\n")
	// Checksums of the third-party modules, as the repository has them:
	// this machine cannot reach the checksum database.
	var sums bytes.Buffer
	for dir := range libraries {
		sums.WriteString(atRev(t, clone, rev, dir+"/go.sum"))
	}
	// The examples' third-party requirements (broker clients, kfake, the
	// OTel SDK and exporter), at the versions the examples pin.
	thirdParty := map[string]bool{}
	for _, name := range examples {
		dir := "examples/" + name
		write(t, filepath.Join(user, "cmd", name+"example", "main.go"), atRev(t, clone, rev, dir+"/main.go"))
		sums.WriteString(atRev(t, clone, rev, dir+"/go.sum"))
		mf, err := modfile.ParseLax(dir+"/go.mod", []byte(atRev(t, clone, rev, dir+"/go.mod")), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range mf.Require {
			if !r.Indirect && !strings.HasPrefix(r.Mod.Path, "github.com/txoutbox/") {
				thirdParty["-require="+r.Mod.String()] = true
			}
		}
	}
	write(t, filepath.Join(user, "go.sum"), sums.String())
	write(t, filepath.Join(user, "cmd/quickstart/main.go"), atRev(t, clone, rev, "examples/quickstart/main.go"))
	write(t, filepath.Join(user, "cmd/gormshop/main.go"), gormProgram)
	write(t, filepath.Join(user, "cmd/deliver/main.go"), deliverProgram)

	// A module cache of the test's own: in the shared one, the first run
	// would leave our modules at version, and every later run would
	// build those instead of HEAD's. Third-party modules come from the
	// shared cache's download directory (a file proxy) or, missing there,
	// from the real proxy. -trimpath keeps the build cache's entries
	// independent of the module cache's location, so they are reused
	// from run to run; CGO_ENABLED=0 too (a cgo package's C flags name
	// its directory): the only cgo package is mattn/go-sqlite3, which
	// gorm.io/driver/sqlite imports and the GORM program does not use
	// (it hands GORM a modernc.org/sqlite connection).
	env := append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw -trimpath",
		"CGO_ENABLED=0",
		"GOMODCACHE="+filepath.Join(t.TempDir(), "mod"),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(goEnv(t, "GOMODCACHE"), "cache", "download"))+","+goEnv(t, "GOPROXY"),
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
	get := []string{"get"}
	for _, path := range libraries {
		get = append(get, path+"@"+version)
	}
	run(get...)
	// Required as the examples' go.mod files do. (go get of a package
	// path such as go.opentelemetry.io/otel/exporters/stdout/stdouttrace
	// at a version fails with "module go.opentelemetry.io/otel@v1.47.0
	// found, but does not contain package" while the enclosing module is
	// in the build list and the nested one not yet downloaded.)
	run(append([]string{"mod", "edit"}, slices.Sorted(maps.Keys(thirdParty))...)...)
	gomod, _ := os.ReadFile(filepath.Join(user, "go.mod"))
	for _, path := range libraries {
		if strings.Contains(string(gomod), "replace") || !strings.Contains(string(gomod), path+" "+version) {
			t.Fatalf("the user's go.mod does not require %s %s:\n%s", path, version, gomod)
		}
	}
	run("build", "./...")
	if out := run("run", "./cmd/deliver"); !strings.Contains(out, "delivered OrderPlaced") {
		t.Fatalf("publish and deliver printed:\n%s", out)
	}
	if out := run("run", "./cmd/gormshop"); !strings.Contains(out, "delivered order.placed") {
		t.Fatalf("the GORM program printed:\n%s", out)
	}
}

// publish writes module path, from dir of the repository at revision
// rev, to the file proxy at version.
func publish(t *testing.T, proxy, repo, rev, dir, path string) {
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
	if err := zip.CreateFromVCS(f, mv, repo, rev, subdir); err != nil {
		t.Fatalf("zip %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(base, version+".mod"), atRev(t, repo, rev, dir+"/go.mod"))
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	write(t, filepath.Join(base, version+".info"), string(info))
	write(t, filepath.Join(base, "list"), version+"\n")
}

// atRev returns the file at path (relative to the repository's root) in
// revision rev.
func atRev(t *testing.T, repo, rev, path string) string {
	t.Helper()
	path = strings.TrimPrefix(filepath.ToSlash(filepath.Clean(path)), "./")
	b, err := exec.Command("git", "-C", repo, "show", rev+":"+path).Output()
	if err != nil {
		t.Fatalf("%s at %s: %v", path, rev, err)
	}
	return string(b)
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
