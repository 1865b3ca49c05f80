// Package dsn turns the database addresses the demo and outboxctl accept
// (-dsn, DATABASE_URL) into a driver name and a DSN for database/sql.
package dsn

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Database says how to open the database a DSN names.
type Database struct {
	Driver  string // database/sql driver: "sqlite", "mysql" or "pgx"
	Dialect string // "sqlite", "mysql" or "postgres"
	DSN     string // for sql.Open
	Display string // for people: no password
	Path    string // the SQLite file, if any
}

// ErrDSN is the help for a DSN that names no database this package knows.
var ErrDSN = errors.New("want mysql://user:password@host:3306/dbname (or the go-sql-driver form user:password@tcp(host:3306)/dbname), postgres://user:password@host:5432/dbname, or sqlite:path/to/file.db; empty means SQLite in the data directory")

// Parse turns a -dsn flag (DATABASE_URL) into a Database. Empty means the
// SQLite file defaultSQLite ("" makes it an error). Errors never repeat
// the DSN, which may hold a password.
func Parse(dsn, defaultSQLite string) (Database, error) {
	switch {
	case dsn == "" && defaultSQLite != "":
		return sqliteDB(defaultSQLite), nil
	case dsn == "":
		return Database{}, fmt.Errorf("-dsn: empty; %w", ErrDSN)
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasPrefix(dsn, "file:"):
		_, path, _ := strings.Cut(dsn, ":")
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return Database{}, fmt.Errorf("-dsn: sqlite: needs a file path; %w", ErrDSN)
		}
		return sqliteDB(path), nil
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return Database{}, fmt.Errorf("-dsn: not a valid postgres:// URL; %w", ErrDSN)
		}
		return Database{Driver: "pgx", Dialect: "postgres", DSN: dsn, Display: "postgres " + hostDB(u)}, nil
	case strings.HasPrefix(dsn, "mysql://"), strings.HasPrefix(dsn, "mariadb://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return Database{}, fmt.Errorf("-dsn: not a valid mysql:// URL; %w", ErrDSN)
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
				return Database{}, fmt.Errorf("-dsn: mysql parameters: %w", err)
			}
			c2.User, c2.Passwd, c2.Net, c2.Addr, c2.DBName = cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName
			cfg = c2
		}
		return mysqlDB(cfg), nil
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") || strings.HasPrefix(dsn, "tcp("):
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return Database{}, fmt.Errorf("-dsn: not a valid go-sql-driver/mysql DSN; %w", ErrDSN)
		}
		return mysqlDB(cfg), nil
	}
	return Database{}, fmt.Errorf("-dsn: unknown form; %w", ErrDSN)
}

func sqliteDB(path string) Database {
	return Database{Driver: "sqlite", Dialect: "sqlite", DSN: sqlstore.SQLiteDSN(path), Display: "sqlite " + path, Path: path}
}

// mysqlDB fixes the options the outbox relies on: times as time.Time in UTC,
// and client-side interpolation, which the outbox's measurements favour.
func mysqlDB(cfg *mysql.Config) Database {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	return Database{Driver: "mysql", Dialect: "mysql", DSN: cfg.FormatDSN(),
		Display: fmt.Sprintf("mysql %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)}
}

func hostDB(u *url.URL) string {
	user := ""
	if u.User != nil {
		user = u.User.Username() + "@"
	}
	return user + u.Host + u.Path
}
