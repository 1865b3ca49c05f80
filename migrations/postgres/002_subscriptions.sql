-- Subscriptions and their per-event delivery state (PostgreSQL 12+).
CREATE TABLE IF NOT EXISTS {{subscriptions}} (
  name         VARCHAR(100) NOT NULL PRIMARY KEY,
  event_types  TEXT         NULL,
  paused       BOOLEAN      NOT NULL DEFAULT FALSE,
  created_at   TIMESTAMPTZ  NOT NULL,
  seen_at      TIMESTAMPTZ  NOT NULL
);
-- One row per (event, subscription) that did not succeed at the event's
-- first delivery; an event every subscription delivered has none.
CREATE TABLE IF NOT EXISTS {{deliveries}} (
  event_id     VARCHAR(64)  NOT NULL,
  subscription VARCHAR(100) NOT NULL,
  status       SMALLINT     NOT NULL DEFAULT 0,
  attempts     INTEGER      NOT NULL DEFAULT 0,
  available_at TIMESTAMPTZ  NOT NULL,
  created_at   TIMESTAMPTZ  NOT NULL,
  done_at      TIMESTAMPTZ  NULL,
  locked_by    VARCHAR(64)  NULL,
  locked_until TIMESTAMPTZ  NULL,
  last_error   TEXT         NULL,
  PRIMARY KEY (event_id, subscription)
);
CREATE INDEX IF NOT EXISTS {{name}}_deliveries_due ON {{deliveries}} (status, subscription, available_at);
-- The failed attempts of each delivery, for operators (last errors and
-- when they happened); written only on failure.
CREATE TABLE IF NOT EXISTS {{attempts}} (
  event_id     VARCHAR(64) NOT NULL,
  subscription VARCHAR(100) NOT NULL,
  attempt      INTEGER NOT NULL,
  at           TIMESTAMPTZ NOT NULL,
  error        TEXT NULL
);
CREATE INDEX IF NOT EXISTS {{name}}_attempts_delivery ON {{attempts}} (event_id, subscription, at);
