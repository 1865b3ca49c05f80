-- Subscriptions and their per-event delivery state (SQLite).
CREATE TABLE IF NOT EXISTS {{subscriptions}} (
  name         TEXT    NOT NULL PRIMARY KEY,
  event_types  TEXT    NULL,
  paused       INTEGER NOT NULL DEFAULT 0,
  created_at   INTEGER NOT NULL,
  seen_at      INTEGER NOT NULL
);
-- One row per (event, subscription) that did not succeed at the event's
-- first delivery; an event every subscription delivered has none.
CREATE TABLE IF NOT EXISTS {{deliveries}} (
  event_id     TEXT    NOT NULL,
  subscription TEXT    NOT NULL,
  status       INTEGER NOT NULL DEFAULT 0,
  attempts     INTEGER NOT NULL DEFAULT 0,
  available_at INTEGER NOT NULL,
  created_at   INTEGER NOT NULL,
  done_at      INTEGER NULL,
  locked_by    TEXT    NULL,
  locked_until INTEGER NULL,
  last_error   TEXT    NULL,
  PRIMARY KEY (event_id, subscription)
);
CREATE INDEX IF NOT EXISTS {{name}}_deliveries_due ON {{deliveries}} (status, subscription, available_at);
-- The failed attempts of each delivery, for operators (last errors and
-- when they happened); written only on failure.
CREATE TABLE IF NOT EXISTS {{attempts}} (
  event_id     TEXT NOT NULL,
  subscription TEXT NOT NULL,
  attempt      INTEGER NOT NULL,
  at           INTEGER NOT NULL,
  error        TEXT NULL
);
CREATE INDEX IF NOT EXISTS {{name}}_attempts_delivery ON {{attempts}} (event_id, subscription, at);
