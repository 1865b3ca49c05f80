-- No two events of one ordering key share a number (PostgreSQL 12+). An
-- instance that has just committed a key's event numbers the key's next
-- event itself, without the key's row in <table>_keys; this index is what
-- stops two instances from taking the same number (the second's INSERT …
-- ON CONFLICT DO NOTHING writes nothing, and it takes its number from the
-- key's row). Events that are not ordered stay out of it.
CREATE UNIQUE INDEX IF NOT EXISTS {{name}}_key_num ON {{table}} (ordering_key, key_seq) WHERE key_seq IS NOT NULL;
