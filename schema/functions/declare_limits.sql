-- The limits a batch of keyed starts declares, before the start inserts its
-- runs (the start's admission reads them): new keys are created, a changed
-- limit replaces the declared one, and each key fills the slots it may have
-- gained (a key whose queue is empty, the usual case, finds nothing to fill).
-- An operator's override is kept.
-- Fenced like the start (shardq.fence, `probes`: an id of each key's bucket),
-- so a key row is never written where its bucket does not live.
CREATE OR REPLACE FUNCTION shardq.declare_limits(
    p_keys text[], p_buckets integer[], p_limits integer[], p_probes uuid[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    declared_keys text[];
BEGIN
    PERFORM shardq.fence(p_probes);
    -- Before the key rows: every holder of it may go on to lock them.
    PERFORM pg_advisory_xact_lock(shardq.admission_lock_key());
    WITH declared AS (
        INSERT INTO shardq.concurrency_keys AS k (key, bucket, declared)
        -- Sorted: two starts lock the rows they share in the same order.
        SELECT d.key, d.bucket, d.lim
        FROM unnest(p_keys, p_buckets, p_limits) AS d(key, bucket, lim)
        ORDER BY d.key
        -- Every declared key is touched (updated_at), so the housekeeping, which
        -- deletes keys idle for an hour, never deletes one a start is about to use.
        ON CONFLICT (key) DO UPDATE SET declared = excluded.declared, updated_at = now()
        RETURNING k.key
    )
    SELECT array_agg(key ORDER BY key) INTO declared_keys FROM declared;
    IF declared_keys IS NOT NULL THEN
        PERFORM shardq.fill_slots(declared_keys);
    END IF;
END
$$;
