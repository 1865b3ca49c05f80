-- The subscription registry's version (SQLite): one row, incremented by
-- the registration that records a subscription not known before, or
-- widens one's types. The writes that complete an event for a set of
-- subscriptions carry the version the engine decided that set by, and
-- change nothing if it is no longer this one (the registry fence).
CREATE TABLE IF NOT EXISTS {{registry}} (
  id       INTEGER NOT NULL PRIMARY KEY,
  version  INTEGER NOT NULL
);
INSERT OR IGNORE INTO {{registry}} (id, version) VALUES (1, 1);
