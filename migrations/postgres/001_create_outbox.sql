-- The outbox table for PostgreSQL 12+.
CREATE TABLE IF NOT EXISTS {{table}} (
  id             VARCHAR(64)  NOT NULL PRIMARY KEY,
  event_type     VARCHAR(128) NOT NULL,
  aggregate_type VARCHAR(64)  NOT NULL DEFAULT '',
  aggregate_id   VARCHAR(128) NOT NULL DEFAULT '',
  tenant_id      VARCHAR(64)  NOT NULL DEFAULT '',
  headers        TEXT         NULL,
  payload        BYTEA        NOT NULL,
  payload_json   BOOLEAN      NOT NULL,
  occurred_at    TIMESTAMPTZ  NOT NULL,
  status         SMALLINT     NOT NULL DEFAULT 0,
  attempts       INTEGER      NOT NULL DEFAULT 0,
  available_at   TIMESTAMPTZ  NOT NULL,
  created_at     TIMESTAMPTZ  NOT NULL,
  done_at        TIMESTAMPTZ  NULL,
  locked_by      VARCHAR(64)  NULL,
  locked_until   TIMESTAMPTZ  NULL,
  last_error     TEXT         NULL
);
CREATE INDEX IF NOT EXISTS {{name}}_due ON {{table}} (status, available_at);
