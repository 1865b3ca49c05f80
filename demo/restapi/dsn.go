package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/txoutbox/txoutbox/internal/dsn"
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
var errDSN = dsn.ErrForm

// parseDSN turns the -dsn flag (DATABASE_URL) into a database with
// internal/dsn. Empty means the embedded SQLite database in dataDir.
// Errors never repeat the DSN, which may hold a password.
func parseDSN(s, dataDir string) (database, error) {
	var d dsn.DB
	if s == "" {
		d = dsn.SQLite(filepath.Join(dataDir, sqliteFile))
	} else {
		var err error
		if d, err = dsn.Parse(s); err != nil {
			if errors.Is(err, dsn.ErrForm) {
				return database{}, fmt.Errorf("restapi: %w; empty means SQLite in the data directory", err)
			}
			return database{}, fmt.Errorf("restapi: %w", err)
		}
	}
	return database{driver: d.Driver, dialect: d.Dialect, dsn: d.DSN, display: d.Display, path: d.Path}, nil
}
