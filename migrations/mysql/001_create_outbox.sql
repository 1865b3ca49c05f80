-- The outbox table for MySQL 8 and MariaDB 10.6+.
-- Times are UTC, written with the server's UTC_TIMESTAMP(6).
-- payload is a blob so that listeners receive exactly the published bytes.
CREATE TABLE IF NOT EXISTS {{table}} (
  id             VARCHAR(64)  NOT NULL,
  event_type     VARCHAR(128) NOT NULL,
  aggregate_type VARCHAR(64)  NOT NULL DEFAULT '',
  aggregate_id   VARCHAR(128) NOT NULL DEFAULT '',
  tenant_id      VARCHAR(64)  NOT NULL DEFAULT '',
  headers        TEXT         NULL,
  payload        MEDIUMBLOB   NOT NULL,
  payload_json   TINYINT(1)   NOT NULL,
  occurred_at    DATETIME(6)  NOT NULL,
  status         TINYINT      NOT NULL DEFAULT 0,
  attempts       INT          NOT NULL DEFAULT 0,
  available_at   DATETIME(6)  NOT NULL,
  created_at     DATETIME(6)  NOT NULL,
  done_at        DATETIME(6)  NULL,
  locked_by      VARCHAR(64)  NULL,
  locked_until   DATETIME(6)  NULL,
  last_error     TEXT         NULL,
  PRIMARY KEY (id),
  KEY {{name}}_due (status, available_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
