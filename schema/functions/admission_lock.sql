-- The one lock every concurrency admission and release on a shard holds until
-- its transaction ends (see admit_task.sql for why one, not one per key).
CREATE OR REPLACE FUNCTION shardq.admission_lock() RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtext('shardq.concurrency'))
$$;
