// Package migrations holds the SQL that creates the outbox table (and the
// inbox tables of package inbox), one folder per dialect (mysql, postgres,
// sqlite), embedded so that the library and the outboxctl CLI apply the
// same files.
//
// Files are named NNN_description.sql and applied in order. The token
// {{table}} stands for the quoted table name and {{name}} for its bare
// name (used in index names); sqlstore.Store.Migrate substitutes them and
// records each applied version in the table <table>_schema.
package migrations

import "embed"

// FS holds mysql/*.sql, postgres/*.sql and sqlite/*.sql.
//
//go:embed mysql/*.sql postgres/*.sql sqlite/*.sql
var FS embed.FS
