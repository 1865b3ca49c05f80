-- Subscriptions and their per-event delivery state (MySQL 8, MariaDB 10.6+).
-- A subscription is registered by every instance that has it; paused
-- subscriptions take no events on any instance.
CREATE TABLE IF NOT EXISTS {{subscriptions}} (
  name         VARCHAR(100) NOT NULL,
  event_types  TEXT         NULL,
  paused       TINYINT(1)   NOT NULL DEFAULT 0,
  created_at   DATETIME(6)  NOT NULL,
  seen_at      DATETIME(6)  NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- One row per (event, subscription) that did not succeed at the event's
-- first delivery; an event every subscription delivered has none.
CREATE TABLE IF NOT EXISTS {{deliveries}} (
  event_id     VARCHAR(64)  NOT NULL,
  subscription VARCHAR(100) NOT NULL,
  status       TINYINT      NOT NULL DEFAULT 0,
  attempts     INT          NOT NULL DEFAULT 0,
  available_at DATETIME(6)  NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  done_at      DATETIME(6)  NULL,
  locked_by    VARCHAR(64)  NULL,
  locked_until DATETIME(6)  NULL,
  last_error   TEXT         NULL,
  PRIMARY KEY (event_id, subscription),
  KEY {{name}}_deliveries_due (status, subscription, available_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- The failed attempts of each delivery, for operators (last errors and
-- when they happened); written only on failure.
CREATE TABLE IF NOT EXISTS {{attempts}} (
  event_id     VARCHAR(64)  NOT NULL,
  subscription VARCHAR(100) NOT NULL,
  attempt      INT          NOT NULL,
  at           DATETIME(6)  NOT NULL,
  error        TEXT         NULL,
  KEY {{name}}_attempts_delivery (event_id, subscription, at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
