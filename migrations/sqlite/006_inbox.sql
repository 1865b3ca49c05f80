-- The inbox (SQLite): one row per (consumer, message id) that a receiver
-- applied (status 1), parked after too many failures (status 2, with the
-- message and the last error) or discarded from the parked ones (status
-- 3). The primary key is the dedupe: a message whose row exists is not
-- handled again. Times are integer microseconds since the epoch.
CREATE TABLE IF NOT EXISTS {{inbox}} (
  consumer     TEXT    NOT NULL,
  message_id   TEXT    NOT NULL,
  status       INTEGER NOT NULL,
  received_at  INTEGER NOT NULL,
  attempts     INTEGER NOT NULL DEFAULT 1,
  last_error   TEXT    NULL,
  headers      TEXT    NULL,
  payload      BLOB    NULL,
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{name}}_inbox_age ON {{inbox}} (status, received_at);
-- Failed attempts of messages not yet applied nor parked, written outside
-- the handler's transaction (which rolled back).
CREATE TABLE IF NOT EXISTS {{inbox_failures}} (
  consumer     TEXT    NOT NULL,
  message_id   TEXT    NOT NULL,
  attempts     INTEGER NOT NULL,
  last_error   TEXT    NULL,
  failed_at    INTEGER NOT NULL,
  PRIMARY KEY (consumer, message_id)
);
CREATE INDEX IF NOT EXISTS {{name}}_inbox_failures_age ON {{inbox_failures}} (failed_at);
