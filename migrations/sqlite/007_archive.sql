-- The archive (SQLite): with sqlstore's Options.ArchiveDelivered, a
-- delivered event is moved here, in the transaction that completes it,
-- instead of being kept DONE or deleted. The event's columns (as a DONE
-- row would have them) plus when (delivered_at, the database's clock, in
-- microseconds since the epoch) and by which instance (delivered_by) it
-- was delivered. The delivered_at index serves the archive's retention,
-- the other two the search by type and by aggregate.
CREATE TABLE IF NOT EXISTS {{archive}} (
  id             TEXT    NOT NULL,
  event_type     TEXT    NOT NULL,
  aggregate_type TEXT    NOT NULL DEFAULT '',
  aggregate_id   TEXT    NOT NULL DEFAULT '',
  tenant_id      TEXT    NOT NULL DEFAULT '',
  headers        TEXT    NULL,
  payload        BLOB    NOT NULL,
  payload_json   INTEGER NOT NULL,
  occurred_at    INTEGER NOT NULL,
  status         INTEGER NOT NULL DEFAULT 1,
  attempts       INTEGER NOT NULL DEFAULT 0,
  available_at   INTEGER NOT NULL,
  created_at     INTEGER NOT NULL,
  done_at        INTEGER NULL,
  locked_by      TEXT    NULL,
  locked_until   INTEGER NULL,
  last_error     TEXT    NULL,
  ordering_key   TEXT    NULL,
  key_seq        INTEGER NULL,
  delivered_at   INTEGER NOT NULL,
  delivered_by   TEXT    NOT NULL,
  PRIMARY KEY (id, delivered_at)
);
CREATE INDEX IF NOT EXISTS {{name}}_archive_age ON {{archive}} (delivered_at);
CREATE INDEX IF NOT EXISTS {{name}}_archive_type ON {{archive}} (event_type, id);
CREATE INDEX IF NOT EXISTS {{name}}_archive_aggregate ON {{archive}} (aggregate_type, aggregate_id, id);
