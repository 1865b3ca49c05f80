-- The inbox (PostgreSQL 12+): one row per (consumer, message id) that a
-- receiver applied (status 1), parked after too many failures (status 2,
-- with the message and the last error) or discarded from the parked ones
-- (status 3). The primary key is the dedupe: a message whose row exists
-- is not handled again.
CREATE TABLE IF NOT EXISTS {{inbox}} (
  consumer     VARCHAR(100) NOT NULL,
  message_id   VARCHAR(255) NOT NULL,
  status       SMALLINT     NOT NULL,
  received_at  TIMESTAMPTZ  NOT NULL,
  attempts     INTEGER      NOT NULL DEFAULT 1,
  last_error   TEXT         NULL,
  headers      TEXT         NULL,
  payload      BYTEA        NULL,
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{name}}_inbox_age ON {{inbox}} (status, received_at);
-- Failed attempts of messages not yet applied nor parked, written outside
-- the handler's transaction (which rolled back).
CREATE TABLE IF NOT EXISTS {{inbox_failures}} (
  consumer     VARCHAR(100) NOT NULL,
  message_id   VARCHAR(255) NOT NULL,
  attempts     INTEGER      NOT NULL,
  last_error   TEXT         NULL,
  failed_at    TIMESTAMPTZ  NOT NULL,
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{name}}_inbox_failures_age ON {{inbox_failures}} (failed_at);
