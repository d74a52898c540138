-- An operator's limit for a key (`shardq limits set`), or NULL to go back to
-- the declared one (`shardq limits reset`). A limit that grew promotes queued
-- runs in this transaction; one that shrank lets the admitted runs finish.
-- Answers the key's row as it now is, none when the key is not on this shard.
-- Fenced (p_probe: an id of the key's bucket), as every write of a bucket is.
CREATE OR REPLACE FUNCTION shardq.set_concurrency_limit(
    p_key text, p_override integer, p_probe uuid)
RETURNS TABLE (key text, declared integer, override integer, running bigint, waiting bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    PERFORM shardq.fence(ARRAY[p_probe]);
    -- Before the key row: every holder of it may go on to lock it.
    PERFORM pg_advisory_xact_lock(shardq.admission_lock_key());
    UPDATE shardq.concurrency_keys k SET override = p_override, updated_at = now()
    WHERE k.key = p_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM shardq.fill_slots(ARRAY[p_key]);
    RETURN QUERY
    SELECT k.key, k.declared, k.override, k.held::bigint,
           (SELECT count(*) FROM shardq.key_queue q WHERE q.concurrency_key = k.key)
    FROM shardq.concurrency_keys k WHERE k.key = p_key;
END
$$;
