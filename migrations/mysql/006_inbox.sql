-- The inbox (MySQL 8, MariaDB 10.6+): one row per (consumer, message id)
-- that a receiver applied (status 1), parked after too many failures
-- (status 2, with the message and the last error) or discarded from the
-- parked ones (status 3). The primary key is the dedupe: a message whose
-- row exists is not handled again. Ids and consumer names are binary so
-- that they compare byte for byte (no case folding, no trailing-space
-- padding).
CREATE TABLE IF NOT EXISTS {{inbox}} (
  consumer     VARBINARY(100) NOT NULL,
  message_id   VARBINARY(255) NOT NULL,
  status       TINYINT        NOT NULL,
  received_at  DATETIME(6)    NOT NULL,
  attempts     INT            NOT NULL DEFAULT 1,
  last_error   TEXT           NULL,
  headers      TEXT           NULL,
  payload      LONGBLOB       NULL,
  PRIMARY KEY (consumer, message_id),
  KEY {{name}}_inbox_age (status, received_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Failed attempts of messages not yet applied nor parked, written outside
-- the handler's transaction (which rolled back).
CREATE TABLE IF NOT EXISTS {{inbox_failures}} (
  consumer     VARBINARY(100) NOT NULL,
  message_id   VARBINARY(255) NOT NULL,
  attempts     INT            NOT NULL,
  last_error   TEXT           NULL,
  failed_at    DATETIME(6)    NOT NULL,
  PRIMARY KEY (consumer, message_id),
  KEY {{name}}_inbox_failures_age (failed_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
