-- Give up to `free` slots of a key to its queued runs, highest priority first,
-- then oldest: each leaves the queue and gets its task row, due now, through
-- admit_task (which counts it in `held`). Answers how many. The caller holds
-- the admission lock and has counted `free` under it: on a slot freed
-- (release_slot), on a limit that may have grown (declare_limits,
-- set_concurrency_limit).
CREATE OR REPLACE FUNCTION shardq.promote_queued(p_key text, p_free integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    promoted integer;
    top      smallint;
BEGIN
    WITH next AS (
        DELETE FROM shardq.key_queue q
        WHERE q.execution_id IN (
            SELECT n.execution_id FROM shardq.key_queue n
            WHERE n.concurrency_key = p_key
            ORDER BY n.priority DESC, n.queued_at
            LIMIT p_free)
        RETURNING q.execution_id, q.claims, q.priority, q.concurrency_key
    ), woken AS (
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key)
        SELECT n.execution_id, now(), n.claims, n.priority, n.concurrency_key FROM next n
        ON CONFLICT (execution_id) DO NOTHING
        RETURNING priority
    )
    SELECT count(*), max(priority) INTO promoted, top FROM woken;
    IF promoted > 0 THEN
        PERFORM pg_notify(shardq.wake_channel(), shardq.wake_note(top));
    END IF;
    RETURN promoted;
END
$$;
