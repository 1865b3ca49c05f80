-- The archive (MySQL 8, MariaDB 10.6+): with sqlstore's
-- Options.ArchiveDelivered, a delivered event is moved here, in the
-- transaction that completes it, instead of being kept DONE or deleted.
-- The event's columns (as a DONE row would have them) plus when
-- (delivered_at, the database's clock) and by which instance
-- (delivered_by) it was delivered. The primary key holds delivered_at so
-- that the table can be partitioned by it (RANGE COLUMNS(delivered_at):
-- MySQL wants the partitioning column in every unique key); the
-- delivered_at index serves the archive's retention, the other two the
-- search by type and by aggregate.
CREATE TABLE IF NOT EXISTS {{archive}} (
  id             VARCHAR(64)  NOT NULL,
  event_type     VARCHAR(128) NOT NULL,
  aggregate_type VARCHAR(64)  NOT NULL DEFAULT '',
  aggregate_id   VARCHAR(128) NOT NULL DEFAULT '',
  tenant_id      VARCHAR(64)  NOT NULL DEFAULT '',
  headers        TEXT         NULL,
  payload        MEDIUMBLOB   NOT NULL,
  payload_json   TINYINT(1)   NOT NULL,
  occurred_at    DATETIME(6)  NOT NULL,
  status         TINYINT      NOT NULL DEFAULT 1,
  attempts       INT          NOT NULL DEFAULT 0,
  available_at   DATETIME(6)  NOT NULL,
  created_at     DATETIME(6)  NOT NULL,
  done_at        DATETIME(6)  NULL,
  locked_by      VARCHAR(64)  NULL,
  locked_until   DATETIME(6)  NULL,
  last_error     TEXT         NULL,
  ordering_key   VARCHAR(255) NULL,
  key_seq        BIGINT       NULL,
  delivered_at   DATETIME(6)  NOT NULL,
  delivered_by   VARCHAR(64)  NOT NULL,
  PRIMARY KEY (id, delivered_at),
  KEY {{name}}_archive_age (delivered_at),
  KEY {{name}}_archive_type (event_type, id),
  KEY {{name}}_archive_aggregate (aggregate_type, aggregate_id, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
