-- Per-key ordering (MySQL 8, MariaDB 10.6+). An event delivered in order
-- carries its ordering key and its number in that key's sequence; other
-- events leave both NULL. The index finds a key's undelivered events in
-- sequence order, and the keys that have events due.
ALTER TABLE {{table}}
  ADD COLUMN ordering_key VARCHAR(255) NULL,
  ADD COLUMN key_seq      BIGINT       NULL,
  ADD KEY {{name}}_key_seq (status, ordering_key, key_seq);
-- The last sequence number of each ordering key, and the last of its
-- events known to be delivered (a hint the engine keeps: at most that far,
-- every event of the key is delivered). Publishing an ordered event
-- updates its key's row, which holds the publishing transactions of one
-- key one after another until each commits.
CREATE TABLE IF NOT EXISTS {{keys}} (
  ordering_key VARCHAR(255) NOT NULL,
  seq          BIGINT       NOT NULL,
  done_seq     BIGINT       NOT NULL DEFAULT 0,
  PRIMARY KEY (ordering_key)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- Which subscriptions are ordered (0 no, 1 a dead event blocks its key,
-- 2 a dead event is passed over), so that an instance numbers the events
-- of an ordered subscription that only other instances run.
ALTER TABLE {{subscriptions}} ADD COLUMN ordering TINYINT NOT NULL DEFAULT 0;
