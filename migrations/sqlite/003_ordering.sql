-- Per-key ordering (SQLite). An event delivered in order carries its
-- ordering key and its number in that key's sequence; other events leave
-- both NULL (and stay out of the partial index).
ALTER TABLE {{table}} ADD COLUMN ordering_key TEXT NULL;
ALTER TABLE {{table}} ADD COLUMN key_seq INTEGER NULL;
CREATE INDEX IF NOT EXISTS {{name}}_key_seq ON {{table}} (status, ordering_key, key_seq) WHERE key_seq IS NOT NULL;
-- The last sequence number of each ordering key, and the last of its
-- events known to be delivered (a hint: at most that far, every event of
-- the key is delivered).
CREATE TABLE IF NOT EXISTS {{keys}} (
  ordering_key TEXT    NOT NULL PRIMARY KEY,
  seq          INTEGER NOT NULL,
  done_seq     INTEGER NOT NULL DEFAULT 0
);
-- Which subscriptions are ordered (0 no, 1 a dead event blocks its key,
-- 2 a dead event is passed over), so that an instance numbers the events
-- of an ordered subscription that only other instances run.
ALTER TABLE {{subscriptions}} ADD COLUMN ordering INTEGER NOT NULL DEFAULT 0;
