-- The outbox table for SQLite 3.42+. Times are integer microseconds since
-- the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS {{table}} (
  id             TEXT    NOT NULL PRIMARY KEY,
  event_type     TEXT    NOT NULL,
  aggregate_type TEXT    NOT NULL DEFAULT '',
  aggregate_id   TEXT    NOT NULL DEFAULT '',
  tenant_id      TEXT    NOT NULL DEFAULT '',
  headers        TEXT    NULL,
  payload        BLOB    NOT NULL,
  payload_json   INTEGER NOT NULL,
  occurred_at    INTEGER NOT NULL,
  status         INTEGER NOT NULL DEFAULT 0,
  attempts       INTEGER NOT NULL DEFAULT 0,
  available_at   INTEGER NOT NULL,
  created_at     INTEGER NOT NULL,
  done_at        INTEGER NULL,
  locked_by      TEXT    NULL,
  locked_until   INTEGER NULL,
  last_error     TEXT    NULL
);
CREATE INDEX IF NOT EXISTS {{name}}_due ON {{table}} (status, available_at);
