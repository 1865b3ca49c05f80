-- Per-key ordering (PostgreSQL 12+). An event delivered in order carries
-- its ordering key and its number in that key's sequence; other events
-- leave both NULL (and stay out of the partial index).
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS ordering_key VARCHAR(255) NULL;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS key_seq BIGINT NULL;
CREATE INDEX IF NOT EXISTS {{name}}_key_seq ON {{table}} (status, ordering_key, key_seq) WHERE key_seq IS NOT NULL;
-- The last sequence number of each ordering key, and the last of its
-- events known to be delivered (a hint the engine keeps: at most that far,
-- every event of the key is delivered). Publishing an ordered event
-- updates its key's row, which holds the publishing transactions of one
-- key one after another until each commits.
CREATE TABLE IF NOT EXISTS {{keys}} (
  ordering_key VARCHAR(255) NOT NULL PRIMARY KEY,
  seq          BIGINT       NOT NULL,
  done_seq     BIGINT       NOT NULL DEFAULT 0
);
-- Which subscriptions are ordered (0 no, 1 a dead event blocks its key,
-- 2 a dead event is passed over), so that an instance numbers the events
-- of an ordered subscription that only other instances run.
ALTER TABLE {{subscriptions}} ADD COLUMN ordering SMALLINT NOT NULL DEFAULT 0;
