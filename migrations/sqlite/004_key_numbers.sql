-- No two events of one ordering key share a number (SQLite). SQLite's
-- publishers always number from the key's row (one writer at a time);
-- the index states the invariant the other databases rely on. Events that
-- are not ordered stay out of it.
CREATE UNIQUE INDEX IF NOT EXISTS {{name}}_key_num ON {{table}} (ordering_key, key_seq) WHERE key_seq IS NOT NULL;
