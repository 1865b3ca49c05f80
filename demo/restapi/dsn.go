package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// database says how to open the database a DSN names.
type database struct {
	driver  string // database/sql driver: "sqlite", "mysql" or "pgx"
	dialect string // "sqlite", "mysql" or "postgres"
	dsn     string // for sql.Open
	display string // for people: no password
	path    string // the SQLite file, if any
}

// sqliteFile is the database file in the data directory.
const sqliteFile = "restapi.db"

// errDSN is the help for a DSN that names no database this program knows.
var errDSN = errors.New("want mysql://user:password@host:3306/dbname (or the go-sql-driver form user:password@tcp(host:3306)/dbname), postgres://user:password@host:5432/dbname, or sqlite:path/to/file.db; empty means SQLite in the data directory")

// parseDSN turns the -dsn flag (DATABASE_URL) into a database. Empty means
// the embedded SQLite database in dataDir. Errors never repeat the DSN,
// which may hold a password.
func parseDSN(dsn, dataDir string) (database, error) {
	switch {
	case dsn == "":
		return sqliteDB(filepath.Join(dataDir, sqliteFile)), nil
	case strings.HasPrefix(dsn, "sqlite:"), strings.HasPrefix(dsn, "file:"):
		_, path, _ := strings.Cut(dsn, ":")
		path = strings.TrimPrefix(path, "//")
		if path == "" {
			return database{}, fmt.Errorf("restapi: -dsn: sqlite: needs a file path; %w", errDSN)
		}
		return sqliteDB(path), nil
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return database{}, fmt.Errorf("restapi: -dsn: not a valid postgres:// URL; %w", errDSN)
		}
		return database{driver: "pgx", dialect: "postgres", dsn: dsn, display: "postgres " + hostDB(u)}, nil
	case strings.HasPrefix(dsn, "mysql://"), strings.HasPrefix(dsn, "mariadb://"):
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" {
			return database{}, fmt.Errorf("restapi: -dsn: not a valid mysql:// URL; %w", errDSN)
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
				return database{}, fmt.Errorf("restapi: -dsn: mysql parameters: %w", err)
			}
			c2.User, c2.Passwd, c2.Net, c2.Addr, c2.DBName = cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName
			cfg = c2
		}
		return mysqlDB(cfg), nil
	case strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") || strings.HasPrefix(dsn, "tcp("):
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return database{}, fmt.Errorf("restapi: -dsn: not a valid go-sql-driver/mysql DSN; %w", errDSN)
		}
		return mysqlDB(cfg), nil
	}
	return database{}, fmt.Errorf("restapi: -dsn: unknown form; %w", errDSN)
}

func sqliteDB(path string) database {
	return database{driver: "sqlite", dialect: "sqlite", dsn: sqliteDSN(path), display: "sqlite " + path, path: path}
}

// mysqlDB fixes the options the demo relies on: times as time.Time in UTC,
// and client-side interpolation, which the outbox's measurements favour.
func mysqlDB(cfg *mysql.Config) database {
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.InterpolateParams = true
	return database{driver: "mysql", dialect: "mysql", dsn: cfg.FormatDSN(),
		display: fmt.Sprintf("mysql %s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)}
}

func hostDB(u *url.URL) string {
	user := ""
	if u.User != nil {
		user = u.User.Username() + "@"
	}
	return user + u.Host + u.Path
}
