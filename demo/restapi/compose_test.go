package main

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gopkg.in/yaml.v3"
)

// composeFile is the part of docker-compose.yml the test reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Environment composeEnv                   `yaml:"environment"`
	Ports       []string                     `yaml:"ports"`
	DependsOn   map[string]map[string]string `yaml:"depends_on"`
	Healthcheck struct {
		Test        []string `yaml:"test"`
		Interval    string   `yaml:"interval"`
		Timeout     string   `yaml:"timeout"`
		Retries     int      `yaml:"retries"`
		StartPeriod string   `yaml:"start_period"`
	} `yaml:"healthcheck"`
	Volumes         []string `yaml:"volumes"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
}

// composeEnv accepts both forms of environment: a map, or a list of
// KEY=VALUE strings.
type composeEnv map[string]string

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	*e = composeEnv{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			(*e)[k] = v
		}
		return nil
	}
	var m map[string]string
	if err := n.Decode(&m); err != nil {
		return err
	}
	for k, v := range m {
		(*e)[k] = v
	}
	return nil
}

// containerPort returns the container side of a short port mapping
// ("8080", "8080:8080", "127.0.0.1:3307:3306").
func containerPort(mapping string) string {
	parts := strings.Split(strings.TrimSuffix(mapping, "/tcp"), ":")
	return parts[len(parts)-1]
}

// TestCompose checks docker-compose.yml without a Docker engine: MySQL 8.4
// with a health check, and the demo built from its Dockerfile, started
// once MySQL is healthy, configured only through variables the demo reads,
// listening on the port it publishes, and pointed at the MySQL service
// with the credentials and database that service creates.
func TestCompose(t *testing.T) {
	root := filepath.Join("..", "..")
	src, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(src, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range cf.Services {
			if !yield(k) {
				return
			}
		}
	})
	if !slices.Equal(names, []string{"mysql", "restapi"}) {
		t.Fatalf("services %v, want mysql and restapi", names)
	}
	db, app := cf.Services["mysql"], cf.Services["restapi"]

	t.Run("mysql", func(t *testing.T) {
		if db.Image != "mysql:8.4" && !strings.HasPrefix(db.Image, "mysql:8.4.") {
			t.Errorf("image %q, want mysql:8.4", db.Image)
		}
		for _, k := range []string{"MYSQL_DATABASE", "MYSQL_USER", "MYSQL_PASSWORD"} {
			if db.Environment[k] == "" {
				t.Errorf("environment lacks %s", k)
			}
		}
		if db.Environment["MYSQL_ROOT_PASSWORD"] == "" && db.Environment["MYSQL_ALLOW_EMPTY_PASSWORD"] == "" && db.Environment["MYSQL_RANDOM_ROOT_PASSWORD"] == "" {
			t.Error("environment sets no root password option; the image refuses to start without one")
		}
		hc := db.Healthcheck
		if len(hc.Test) < 2 || hc.Test[0] != "CMD" || !slices.Contains(hc.Test, "mysqladmin") || !slices.Contains(hc.Test, "ping") {
			t.Errorf("healthcheck test %q, want [CMD mysqladmin ping ...]", hc.Test)
		}
		// It must log in as the user the demo uses, over TCP.
		if !slices.Contains(hc.Test, "-u") || hc.Test[slices.Index(hc.Test, "-u")+1] != db.Environment["MYSQL_USER"] ||
			!slices.Contains(hc.Test, "-p"+db.Environment["MYSQL_PASSWORD"]) || !slices.Contains(hc.Test, "127.0.0.1") {
			t.Errorf("healthcheck %q does not log in over TCP as MYSQL_USER with MYSQL_PASSWORD", hc.Test)
		}
		for name, v := range map[string]string{"interval": hc.Interval, "timeout": hc.Timeout, "start_period": hc.StartPeriod} {
			if d, err := time.ParseDuration(v); err != nil || d <= 0 {
				t.Errorf("healthcheck %s %q is not a duration", name, v)
			}
		}
		if hc.Retries < 1 {
			t.Errorf("healthcheck retries %d", hc.Retries)
		}
		for _, p := range db.Ports {
			if containerPort(p) != "3306" {
				t.Errorf("port mapping %q does not publish MySQL's 3306", p)
			}
		}
	})

	t.Run("restapi", func(t *testing.T) {
		// Built from this directory's Dockerfile, with the repository as context.
		if app.Build.Context != "." || app.Build.Dockerfile != "demo/restapi/Dockerfile" {
			t.Errorf("build %+v, want context . and dockerfile demo/restapi/Dockerfile", app.Build)
		}
		if _, err := os.Stat(filepath.Join(root, app.Build.Context, "go.mod")); err != nil {
			t.Errorf("build context is not the module root: %v", err)
		}
		if cond := app.DependsOn["mysql"]["condition"]; cond != "service_healthy" {
			t.Errorf("depends_on mysql condition %q, want service_healthy", cond)
		}

		// Only variables the demo reads, and they parse.
		known := envNames()
		for k := range app.Environment {
			if !slices.Contains(known, k) {
				t.Errorf("environment sets %s, which the demo does not read (it reads %v)", k, known)
			}
		}
		cfg, err := parseConfig(nil, func(k string) string { return app.Environment[k] }, io.Discard)
		if err != nil {
			t.Fatalf("the demo rejects the compose environment: %v", err)
		}

		// It listens on the port compose publishes.
		_, port, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			t.Fatalf("ADDR %q: %v", cfg.Addr, err)
		}
		if len(app.Ports) != 1 || containerPort(app.Ports[0]) != port {
			t.Errorf("ports %q, want one mapping to the container port %s of ADDR", app.Ports, port)
		}
		if !strings.HasPrefix(app.Ports[0], "8080:") {
			t.Errorf("ports %q: the README's curls use localhost:8080", app.Ports)
		}

		// DATABASE_URL names the mysql service with its user and database.
		d, err := parseDSN(cfg.DSN, cfg.DataDir)
		if err != nil {
			t.Fatalf("DATABASE_URL: %v", err)
		}
		if d.dialect != "mysql" {
			t.Fatalf("DATABASE_URL is %s, want mysql", d.dialect)
		}
		mc, err := mysql.ParseDSN(d.dsn)
		if err != nil {
			t.Fatal(err)
		}
		host, dbPort, _ := net.SplitHostPort(mc.Addr)
		if _, ok := cf.Services[host]; !ok || host != "mysql" || dbPort != "3306" {
			t.Errorf("DATABASE_URL points at %s, want the mysql service on 3306", mc.Addr)
		}
		if mc.User != db.Environment["MYSQL_USER"] || mc.Passwd != db.Environment["MYSQL_PASSWORD"] || mc.DBName != db.Environment["MYSQL_DATABASE"] {
			t.Errorf("DATABASE_URL user/database %s/%s do not match MYSQL_USER/MYSQL_PASSWORD/MYSQL_DATABASE of the mysql service", mc.User, mc.DBName)
		}

		// Docker stops with SIGTERM, then waits stop_grace_period before
		// SIGKILL: it must outlast the demo's drain.
		grace, err := time.ParseDuration(app.StopGracePeriod)
		if err != nil || grace <= cfg.ShutdownTimeout {
			t.Errorf("stop_grace_period %q must be longer than the shutdown timeout %v", app.StopGracePeriod, cfg.ShutdownTimeout)
		}
	})

	t.Run("Dockerfile", func(t *testing.T) {
		src, err := os.ReadFile(filepath.Join(root, app.Build.Dockerfile))
		if err != nil {
			t.Fatal(err)
		}
		df := string(src)
		if !regexp.MustCompile(`(?m)^RUN .*go build .*\./demo/restapi$`).MatchString(df) {
			t.Error("the Dockerfile does not build ./demo/restapi")
		}
		if !regexp.MustCompile(`(?m)^FROM golang:1\.26`).MatchString(df) {
			t.Error("the Dockerfile does not build with Go 1.26, which go.mod requires")
		}
		// EXPOSE matches the published port; ENV sets only known variables.
		cfg, _ := parseConfig(nil, func(k string) string { return app.Environment[k] }, io.Discard)
		_, port, _ := net.SplitHostPort(cfg.Addr)
		if !regexp.MustCompile(`(?m)^EXPOSE ` + port + `$`).MatchString(df) {
			t.Errorf("the Dockerfile does not EXPOSE %s", port)
		}
		for _, m := range regexp.MustCompile(`(?m)^ENV (.*)$`).FindAllStringSubmatch(df, -1) {
			for _, kv := range strings.Fields(m[1]) {
				k, _, _ := strings.Cut(kv, "=")
				if !slices.Contains(envNames(), k) {
					t.Errorf("the Dockerfile sets %s, which the demo does not read", k)
				}
			}
		}
	})
}
