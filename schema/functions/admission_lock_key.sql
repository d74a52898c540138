-- The advisory lock every concurrency admission and release on a shard holds
-- until its transaction ends (see admit_task.sql for why one, not one per key).
-- IMMUTABLE: a constant folded where it is called; b"shardqcl" as a number, as
-- the mover and migrator keys are made (shards/versions.py). Advisory locks are
-- per database, so a shard in a schema of a shared database (shards/layout.py)
-- takes a key of its own: 'shardq.' is written with its schema's name there,
-- 'shardq' || '.' is not.
CREATE OR REPLACE FUNCTION shardq.admission_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE 'shardq.' WHEN 'shardq' || '.' THEN 8316003855878939500::bigint
                ELSE hashtextextended('shardq.admission', 0) END
$$;
