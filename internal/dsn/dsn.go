// Package dsn turns the database addresses that the demo and outboxctl
// accept (-dsn, DATABASE_URL) into a database/sql driver name and DSN, and
// a form safe to print: never the password.
package dsn

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// DB says how to open the database a DSN names.
type DB struct {
	Driver  string // database/sql driver: "sqlite", "mysql" or "pgx"
	Dialect string // "sqlite", "mysql" or "postgres"
	DSN     string // for sql.Open
	Display string // for people: no password
	Path    string // the SQLite file, if any
}

// ErrForm is the help for a DSN that names no database this package knows.
var ErrForm = errors.New("want mysql://user:password@host:3306/dbname (or the go-sql-driver form user:password@tcp(host:3306)/dbname), postgres://user:password@host:5432/dbname, or sqlite:path/to/file.db")

// Parse turns a DSN into a DB. Errors never repeat the DSN, which may hold
// a password.
func Parse(dsn string) (DB, error) {
	switch {
	case dsn == "":
		return DB{}, fmt.Errorf("-dsn: empty; %w", ErrForm)
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasPrefix(dsn, "file:"):
		_, path, _ := strings.Cut(dsn, ":")
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return DB{}, fmt.Errorf("-dsn: sqlite: needs a file path; %w", ErrForm)
		}
		return SQLite(path), nil
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return DB{}, fmt.Errorf("-dsn: not a valid postgres:// URL; %w", ErrForm)
		}
		return DB{Driver: "pgx", Dialect: "postgres", DSN: dsn, Display: "postgres " + hostDB(u)}, nil
	case strings.HasPrefix(dsn, "mysql://"), strings.HasPrefix(dsn, "mariadb://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return DB{}, fmt.Errorf("-dsn: not a valid mysql:// URL; %w", ErrForm)
		}
		cfg := mysql.NewConfig()
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
		cfg.Net = "tcp"
		cfg.Addr = u.Host
		if u.Port() == "" {
			cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
		cfg.DBName = strings.TrimPrefix(u.Path, "/")
		if len(u.Query()) > 0 {
			// Let the driver parse the parameters it knows.
			c2, err := mysql.ParseDSN("/?" + u.RawQuery)
			if err != nil {
				return DB{}, fmt.Errorf("-dsn: mysql parameters: %w", Redact(err, cfg.Passwd))
			}
			c2.User, c2.Passwd, c2.Net, c2.Addr, c2.DBName = cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName
			cfg = c2
		}
		return MySQL(cfg), nil
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") || strings.HasPrefix(dsn, "tcp("):
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return DB{}, fmt.Errorf("-dsn: not a valid go-sql-driver/mysql DSN; %w", ErrForm)
		}
		return MySQL(cfg), nil
	}
	return DB{}, fmt.Errorf("-dsn: unknown form; %w", ErrForm)
}

// SQLite returns the DB of a SQLite file, opened with sqlstore.SQLiteDSN.
func SQLite(path string) DB {
	return DB{Driver: "sqlite", Dialect: "sqlite", DSN: sqlstore.SQLiteDSN(path), Display: "sqlite " + path, Path: path}
}

// MySQL fixes the options the outbox relies on: times as time.Time in
// UTC, and client-side interpolation, which the outbox's measurements
// favour.
func MySQL(cfg *mysql.Config) DB {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	return DB{Driver: "mysql", Dialect: "mysql", DSN: cfg.FormatDSN(),
		Display: fmt.Sprintf("mysql %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)}
}

func hostDB(u *url.URL) string {
	user := ""
	if u.User != nil {
		user = u.User.Username() + "@"
	}
	return user + u.Host + u.Path
}

// Password returns the password a DSN holds, or "", so that callers can
// take it out of the errors they print (see Redact).
func Password(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		p, _ := u.User.Password()
		return p
	}
	if cfg, err := mysql.ParseDSN(dsn); err == nil {
		return cfg.Passwd
	}
	// Unparsable: whatever stands between "user:" and the last "@".
	if m := userinfoRE.FindStringSubmatch(dsn); m != nil {
		return m[1]
	}
	return ""
}

var userinfoRE = regexp.MustCompile(`^(?:[a-z]+://)?[^:/@]*:(.+)@[^@]*$`)

// redacted replaces a password in errors.
const redacted = "xxxxx"

// Redact returns err with every occurrence of password (and of its URL
// escaped form) replaced by xxxxx; err itself if password is empty or
// absent.
func Redact(err error, password string) error {
	if err == nil || password == "" {
		return err
	}
	msg := err.Error()
	out := msg
	for _, p := range []string{password, url.QueryEscape(password), url.PathEscape(password), url.UserPassword("", password).String()[1:]} {
		if p != "" {
			out = strings.ReplaceAll(out, p, redacted)
		}
	}
	if out == msg {
		return err
	}
	return errors.New(out)
}
