-- Give a key's free slots to its queued runs, highest priority first, then
-- oldest: each gets its task row, due now, through admit_task (which admits it,
-- as a slot is free, and takes it out of the queue). Answers how many. Called
-- when a slot is freed (release_slot) and when a key's limit may have grown
-- (declare_limits, set_concurrency_limit).
CREATE OR REPLACE FUNCTION shardq.promote_queued(p_key text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    free     integer;
    promoted integer;
    top      smallint;
BEGIN
    PERFORM shardq.admission_lock();
    SELECT coalesce(k.override, k.declared)
           - (SELECT count(*) FROM shardq.tasks t WHERE t.concurrency_key = p_key)
    INTO free
    FROM shardq.concurrency_keys k WHERE k.key = p_key;
    IF free IS NULL OR free <= 0 THEN
        RETURN 0;
    END IF;
    WITH woken AS (
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key)
        SELECT q.execution_id, now(), q.claims, q.priority, q.concurrency_key
        FROM shardq.key_queue q
        WHERE q.concurrency_key = p_key
        ORDER BY q.priority DESC, q.queued_at
        LIMIT free
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
