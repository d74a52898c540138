-- Give the free slots of these keys to their queued runs, highest priority
-- first, then oldest: each leaves key_queue and gets its task row, due now,
-- and is counted in its key's `held` here (the admission trigger is told to
-- step aside, shardq.slots_counted). Answers how many; wakes the workers when
-- any. The caller holds the admission lock (see admit_task.sql): on slots
-- freed (release_slots), on a limit that may have grown (declare_limits,
-- set_concurrency_limit).
CREATE OR REPLACE FUNCTION shardq.fill_slots(p_keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    promoted integer;
    top      smallint;
    counted  text := current_setting('shardq.slots_counted', true);
BEGIN
    PERFORM set_config('shardq.slots_counted', 'on', true);
    WITH next AS (
        SELECT q.execution_id
        FROM shardq.concurrency_keys k
        CROSS JOIN LATERAL (
            SELECT n.execution_id FROM shardq.key_queue n
            WHERE n.concurrency_key = k.key
            ORDER BY n.priority DESC, n.queued_at
            LIMIT greatest(coalesce(k.override, k.declared) - k.held, 0)
        ) q
        WHERE k.key = ANY(p_keys)
    ), gone AS (
        DELETE FROM shardq.key_queue q WHERE q.execution_id IN (SELECT execution_id FROM next)
        RETURNING q.execution_id, q.concurrency_key, q.priority, q.claims
    ), woken AS (
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key,
                                  tenant, build_id)
        SELECT g.execution_id, now(), g.claims, g.priority, g.concurrency_key, e.tenant,
               CASE WHEN e.pinned THEN e.build_id END
        FROM gone g JOIN shardq.executions e ON e.id = g.execution_id
        ON CONFLICT (execution_id) DO NOTHING
        RETURNING priority, concurrency_key
    ), counted AS (
        UPDATE shardq.concurrency_keys k SET held = k.held + w.n
        FROM (SELECT concurrency_key, count(*)::integer AS n FROM woken GROUP BY 1) w
        WHERE k.key = w.concurrency_key
    )
    SELECT count(*), max(priority) INTO promoted, top FROM woken;
    -- As it was: a caller that counts slots itself keeps it on.
    PERFORM set_config('shardq.slots_counted', coalesce(counted, ''), true);
    IF promoted > 0 THEN
        PERFORM pg_notify(shardq.wake_channel(), shardq.wake_note(top));
    END IF;
    RETURN promoted;
END
$$;
