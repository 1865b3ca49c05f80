-- The subscription registry's version (PostgreSQL 12+): one row,
-- incremented by the registration that records a subscription not known
-- before, or widens one's types. The writes that complete an event for a
-- set of subscriptions carry the version the engine decided that set by,
-- and change nothing if it is no longer this one (the registry fence).
CREATE TABLE IF NOT EXISTS {{registry}} (
  id       SMALLINT NOT NULL PRIMARY KEY,
  version  BIGINT   NOT NULL
);
INSERT INTO {{registry}} (id, version) VALUES (1, 1) ON CONFLICT (id) DO NOTHING;
