package main

import (
	"path/filepath"

	"github.com/txoutbox/txoutbox/internal/dsn"
)

// database says how to open the database a DSN names.
type database = dsn.Database

// sqliteFile is the database file in the data directory.
const sqliteFile = "restapi.db"

// errDSN is the help for a DSN that names no database this program knows.
var errDSN = dsn.ErrDSN

// parseDSN turns the -dsn flag (DATABASE_URL) into a database. Empty means
// the embedded SQLite database in dataDir.
func parseDSN(s, dataDir string) (database, error) {
	return dsn.Parse(s, filepath.Join(dataDir, sqliteFile))
}
