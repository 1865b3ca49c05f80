-- The subscription registry's version (MySQL 8, MariaDB 10.6+): one row,
-- incremented by the registration that records a subscription not known
-- before, or widens one's types. The writes that complete an event for a
-- set of subscriptions carry the version the engine decided that set by,
-- and change nothing if it is no longer this one (the registry fence).
CREATE TABLE IF NOT EXISTS {{registry}} (
  id       TINYINT NOT NULL,
  version  BIGINT  NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
INSERT IGNORE INTO {{registry}} (id, version) VALUES (1, 1);
