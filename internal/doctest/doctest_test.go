package doctest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	pathpkg "path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// skipMark, on the line before a block's fence, leaves the block out.
const skipMark = "<!-- doctest: skip -->"

// knownImports are the packages a fragment may use without importing
// them, by the name it uses: the fragment's file imports those it names.
var knownImports = map[string]string{
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"log":         "log",
	"os":          "os",
	"slog":        "log/slog",
	"sql":         "database/sql",
	"time":        "time",
	"chi":         "github.com/go-chi/chi/v5",
	"chimw":       "github.com/go-chi/chi/v5/middleware",
	"sqlx":        "github.com/jmoiron/sqlx",
	"nats":        "github.com/nats-io/nats.go",
	"jetstream":   "github.com/nats-io/nats.go/jetstream",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"kgo":         "github.com/twmb/franz-go/pkg/kgo",
	"kafkaoutbox": "github.com/txoutbox/txoutbox/adapters/kafka",
	"natsoutbox":  "github.com/txoutbox/txoutbox/adapters/nats",
	"admin":       "github.com/txoutbox/txoutbox/admin",
	"inbox":       "github.com/txoutbox/txoutbox/inbox",
	"middleware":  "github.com/txoutbox/txoutbox/middleware",
	"outbox":      "github.com/txoutbox/txoutbox/outbox",
	"sqlstore":    "github.com/txoutbox/txoutbox/outbox/sqlstore",
	"prom":        "github.com/txoutbox/txoutbox/prom",
	"txmw":        "github.com/txoutbox/txoutbox/txmw",
}

// harnessVar is a name the guides use without declaring it.
type harnessVar struct {
	typ     string
	imports []string
}

// harnessVars are declared at package level beside every fragment (those
// a fragment declares itself at file level excepted), so a fragment reads
// as in the guide.
var harnessVars = map[string]harnessVar{
	"ctx":       {"context.Context", []string{"context"}},
	"db":        {"*sqlx.DB", []string{"github.com/jmoiron/sqlx"}},
	"sqldb":     {"*sql.DB", []string{"database/sql"}},
	"ob":        {"*outbox.Outbox", []string{"github.com/txoutbox/txoutbox/outbox"}},
	"store":     {"*sqlstore.Store", []string{"github.com/txoutbox/txoutbox/outbox/sqlstore"}},
	"send":      {"outbox.Handler", []string{"github.com/txoutbox/txoutbox/outbox"}},
	"sendMail":  {"outbox.Handler", []string{"github.com/txoutbox/txoutbox/outbox"}},
	"ib":        {"*inbox.Inbox", []string{"github.com/txoutbox/txoutbox/inbox"}},
	"apply":     {"inbox.Handler", []string{"github.com/txoutbox/txoutbox/inbox"}},
	"id":        {"string", nil},
	"ids":       {"[]string", nil},
	"orderID":   {"string", nil},
	"body":      {"[]byte", nil},
	"payload":   {"[]byte", nil},
	"headers":   {"map[string]string", nil},
	"nc":        {"*nats.Conn", []string{"github.com/nats-io/nats.go"}},
	"cl":        {"*kgo.Client", []string{"github.com/twmb/franz-go/pkg/kgo"}},
	"app":       {"http.Handler", []string{"net/http"}},
	"tenant":    {"func(*http.Request) string", []string{"net/http"}},
	"shardOf":   {"func(tenant string) string", nil},
	"shardDSNs": {"map[string]string", nil},
}

// block is a Go block of a Markdown file.
type block struct {
	doc  string // the file, from the repository's root: README.md, docs/ordering.md
	line int    // the line of the block's first line of code
	src  string
	skip bool
}

// TestDocBlocksCompile builds every Go block of README.md and docs/*.md
// (the guides; not docs/design/) and vets it: a block that stops
// compiling fails the test with the document's file and line.
func TestDocBlocksCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the documents' Go blocks: not in -short")
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"../../README.md"}, docs...)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var all []block
	for _, path := range docs {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := blocks(strings.TrimPrefix(filepath.ToSlash(path), "../../"), string(text))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, bs...)
	}
	if n := countDoc(all, "README.md"); n < 2 {
		t.Fatalf("README.md has %d Go blocks; the test expects its chi snippet and quick start at least", n)
	}

	// The packages go inside this module, so that its go.mod and the
	// workspace resolve their imports; a leading underscore keeps the
	// directory out of ./... patterns.
	gen, err := os.MkdirTemp(".", "_blocks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(gen) })
	var pkgs []string
	for i, b := range all {
		if b.skip {
			t.Logf("%s:%d: skipped (%s)", b.doc, b.line, skipMark)
			continue
		}
		files, err := generate(b, filepath.Join(root, b.doc))
		if err != nil {
			t.Errorf("%s:%d: %v", b.doc, b.line, err)
			continue
		}
		dir := filepath.Join(gen, fmt.Sprintf("b%03d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		pkgs = append(pkgs, "./"+filepath.ToSlash(dir))
	}
	t.Logf("%d Go blocks in %d documents; building %d", len(all), len(docs), len(pkgs))
	// vet type-checks every package (reporting the errors of each, not
	// only the first) and runs its checks; a fragment is wrapped in a
	// function that ends with "return nil", unreachable after a fragment
	// that returns.
	cmd := exec.Command("go", append([]string{"vet", "-unreachable=false"}, pkgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the documents' Go blocks do not build (the positions are the documents'):\n%s", out)
	}
}

func countDoc(bs []block, doc string) int {
	n := 0
	for _, b := range bs {
		if b.doc == doc {
			n++
		}
	}
	return n
}

// blocks returns the ```go blocks of a Markdown document, also those
// indented in a list or quoted (the prefix before the fence is taken off
// every line of the block).
func blocks(doc, text string) ([]block, error) {
	var out []block
	lines := strings.Split(text, "\n")
	prev := "" // the last non-blank line before the current one
	for i := 0; i < len(lines); i++ {
		prefix, ok := strings.CutSuffix(strings.TrimRight(lines[i], " "), "```go")
		if !ok || strings.Trim(prefix, " >") != "" {
			if strings.TrimSpace(lines[i]) != "" {
				prev = strings.TrimSpace(lines[i])
			}
			continue
		}
		b := block{doc: doc, line: i + 2, skip: prev == skipMark}
		var src strings.Builder
		j := i + 1
		for ; j < len(lines) && strings.TrimRight(lines[j], " ") != prefix+"```"; j++ {
			src.WriteString(strings.TrimPrefix(lines[j], prefix))
			src.WriteByte('\n')
		}
		if j == len(lines) {
			return nil, fmt.Errorf("%s:%d: a Go block that does not end", doc, i+1)
		}
		b.src = src.String()
		out = append(out, b)
		i, prev = j, ""
	}
	return out, nil
}

// generate returns the files of the package that builds b, whose
// positions are those of the document at path.
func generate(b block, path string) (map[string]string, error) {
	directive := fmt.Sprintf("//line %s:%d\n", path, b.line)
	if isFile(b.src) {
		return map[string]string{"block.go": directive + b.src}, nil
	}
	fset := token.NewFileSet()
	wrapped := "func _() error {\n" + directive + b.src + "\nreturn nil\n}\n"
	f, err := parser.ParseFile(fset, "", "package fragment\n"+wrapped, parser.SkipObjectResolution)
	if err != nil {
		// Not statements: declarations, then, at file level.
		wrapped = directive + b.src
		var declErr error
		f, declErr = parser.ParseFile(fset, "", "package fragment\n"+wrapped, parser.SkipObjectResolution)
		if declErr != nil {
			return nil, fmt.Errorf("neither statements nor declarations:\n%v\n%v", err, declErr)
		}
	}
	own := map[string]bool{} // the names the fragment imports itself
	for _, spec := range f.Imports {
		path, _ := strconv.Unquote(spec.Path.Value)
		name := pathpkg.Base(path)
		if spec.Name != nil {
			name = spec.Name.Name
		} else if strings.HasPrefix(name, "v") && strings.Trim(name[1:], "0123456789") == "" {
			name = pathpkg.Base(pathpkg.Dir(path)) // github.com/go-chi/chi/v5
		}
		own[name] = true
	}
	imports := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && knownImports[x.Name] != "" && !own[x.Name] {
				imports[fmt.Sprintf("%s %q", x.Name, knownImports[x.Name])] = true
			}
		}
		return true
	})
	declared := map[string]bool{}
	for _, d := range f.Decls {
		for _, name := range declNames(d) {
			declared[name] = true
		}
	}
	return map[string]string{
		"block.go":   "package fragment\n\n" + importDecl(slices.Sorted(maps.Keys(imports))) + "\n" + wrapped,
		"harness.go": harness(declared),
	}, nil
}

// isFile reports whether src is a complete file: its first line of code
// is a package clause.
func isFile(src string) bool {
	for line := range strings.SplitSeq(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		return strings.HasPrefix(line, "package ")
	}
	return false
}

// declNames returns the names a file-level declaration declares.
func declNames(d ast.Decl) []string {
	var names []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			names = append(names, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				names = append(names, s.Name.Name)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					names = append(names, n.Name)
				}
			}
		}
	}
	return names
}

// harness returns the file that declares the harness's names but those
// the fragment declares.
func harness(declared map[string]bool) string {
	var vars strings.Builder
	imports := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(harnessVars)) {
		if declared[name] {
			continue
		}
		v := harnessVars[name]
		fmt.Fprintf(&vars, "\t%s %s\n", name, v.typ)
		for _, path := range v.imports {
			imports[fmt.Sprintf("%q", path)] = true
		}
	}
	return "package fragment\n\n" + importDecl(slices.Sorted(maps.Keys(imports))) +
		"\n// The names the guides use without declaring them.\nvar (\n" + vars.String() + ")\n"
}

func importDecl(specs []string) string {
	if len(specs) == 0 {
		return ""
	}
	return "import (\n\t" + strings.Join(specs, "\n\t") + "\n)\n"
}

// The extraction finds indented and quoted blocks, a skip mark, the line
// of a block's code, and refuses a block that does not end.
func TestBlocks(t *testing.T) {
	text := "# T\n\n```go\npackage main\n```\n\n- item\n\n  ```go\n  x := 1\n  ```\n\n" +
		skipMark + "\n```go\nnot Go\n```\n> ```go\n> y()\n> ```\n"
	got, err := blocks("T.md", text)
	if err != nil {
		t.Fatal(err)
	}
	want := []block{
		{doc: "T.md", line: 4, src: "package main\n"},
		{doc: "T.md", line: 10, src: "x := 1\n"},
		{doc: "T.md", line: 15, src: "not Go\n", skip: true},
		{doc: "T.md", line: 18, src: "y()\n"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("blocks:\n got %+v\nwant %+v", got, want)
	}
	if _, err := blocks("T.md", "```go\nx := 1\n"); err == nil {
		t.Fatal("a block without its closing fence was accepted")
	}
	if !isFile("// Command x.\npackage main\n") || isFile("x := 1\n") {
		t.Fatal("isFile")
	}
}

// A fragment of statements is wrapped in a function and imports what it
// names; a fragment of declarations stays at file level, its names are
// not declared again by the harness, nor its imports imported again.
func TestGenerate(t *testing.T) {
	files, err := generate(block{doc: "T.md", line: 3, src: "ob.Handle(\"log\", send)\nlog.Print(id)\n"}, "T.md")
	if err != nil {
		t.Fatal(err)
	}
	if b := files["block.go"]; !strings.Contains(b, "func _() error {\n//line T.md:3\n") || !strings.Contains(b, `log "log"`) {
		t.Fatalf("statements:\n%s", b)
	}
	files, err = generate(block{doc: "T.md", line: 3, src: "func send(ctx context.Context, ev outbox.Event) error { return nil }\n"}, "T.md")
	if err != nil {
		t.Fatal(err)
	}
	if b := files["block.go"]; strings.Contains(b, "func _()") {
		t.Fatalf("declarations were wrapped:\n%s", b)
	}
	if h := files["harness.go"]; strings.Contains(h, "\tsend ") || !strings.Contains(h, "\tctx context.Context") {
		t.Fatalf("harness:\n%s", h)
	}
	files, err = generate(block{doc: "T.md", line: 3, src: "import chimw \"github.com/go-chi/chi/v5/middleware\"\n\nvar h = chimw.Recoverer\n"}, "T.md")
	if err != nil {
		t.Fatal(err)
	}
	if b := files["block.go"]; strings.Count(b, "chi/v5/middleware") != 1 {
		t.Fatalf("a package the fragment imports was imported again:\n%s", b)
	}
	if _, err := generate(block{doc: "T.md", line: 3, src: "}{"}, "T.md"); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Fatalf("a block that is not Go: %v", err)
	}
}
