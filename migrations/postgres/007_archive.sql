-- The archive (PostgreSQL 12+): with sqlstore's Options.ArchiveDelivered,
-- a delivered event is moved here, in the transaction that completes it,
-- instead of being kept DONE or deleted. The event's columns (as a DONE
-- row would have them) plus when (delivered_at, the database's clock) and
-- by which instance (delivered_by) it was delivered. The delivered_at
-- index serves the archive's retention, the other two the search by type
-- and by aggregate.
CREATE TABLE IF NOT EXISTS {{archive}} (
  id             VARCHAR(64)  NOT NULL,
  event_type     VARCHAR(128) NOT NULL,
  aggregate_type VARCHAR(64)  NOT NULL DEFAULT '',
  aggregate_id   VARCHAR(128) NOT NULL DEFAULT '',
  tenant_id      VARCHAR(64)  NOT NULL DEFAULT '',
  headers        TEXT         NULL,
  payload        BYTEA        NOT NULL,
  payload_json   BOOLEAN      NOT NULL,
  occurred_at    TIMESTAMPTZ  NOT NULL,
  status         SMALLINT     NOT NULL DEFAULT 1,
  attempts       INTEGER      NOT NULL DEFAULT 0,
  available_at   TIMESTAMPTZ  NOT NULL,
  created_at     TIMESTAMPTZ  NOT NULL,
  done_at        TIMESTAMPTZ  NULL,
  locked_by      VARCHAR(64)  NULL,
  locked_until   TIMESTAMPTZ  NULL,
  last_error     TEXT         NULL,
  ordering_key   VARCHAR(255) NULL,
  key_seq        BIGINT       NULL,
  delivered_at   TIMESTAMPTZ  NOT NULL,
  delivered_by   VARCHAR(64)  NOT NULL,
  PRIMARY KEY (id, delivered_at)
);
CREATE INDEX IF NOT EXISTS {{name}}_archive_age ON {{archive}} (delivered_at);
CREATE INDEX IF NOT EXISTS {{name}}_archive_type ON {{archive}} (event_type, id);
CREATE INDEX IF NOT EXISTS {{name}}_archive_aggregate ON {{archive}} (aggregate_type, aggregate_id, id);
