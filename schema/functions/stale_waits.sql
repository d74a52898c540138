-- The waits that look stuck: open longer than their kind's bound (a null
-- bound: never by age alone), or past their deadline by more than p_grace_s
-- seconds and still open (the task that should have woken them is overdue).
-- Each condition is a range scan of waits_age or waits_deadline. It surfaces
-- waits; nothing here resolves one. Read by `shardq stale` and the exporter.
CREATE OR REPLACE FUNCTION shardq.stale_waits(
    p_timer_s     float8,
    p_signal_s    float8,
    p_condition_s float8,
    p_interrupt_s float8,
    p_grace_s     float8
) RETURNS TABLE (execution_id uuid, kind text, name text, started_at timestamptz,
                 deadline timestamptz)
LANGUAGE sql STABLE AS $$
    WITH stale AS (
        SELECT w.execution_id FROM shardq.waits w
        WHERE w.kind = 'timer' AND w.started_at < now() - make_interval(secs => p_timer_s)
        UNION
        SELECT w.execution_id FROM shardq.waits w
        WHERE w.kind = 'signal' AND w.started_at < now() - make_interval(secs => p_signal_s)
        UNION
        SELECT w.execution_id FROM shardq.waits w
        WHERE w.kind = 'condition'
          AND w.started_at < now() - make_interval(secs => p_condition_s)
        UNION
        SELECT w.execution_id FROM shardq.waits w
        WHERE w.kind = 'interrupt'
          AND w.started_at < now() - make_interval(secs => p_interrupt_s)
        UNION
        SELECT w.execution_id FROM shardq.waits w
        WHERE w.deadline < now() - make_interval(secs => p_grace_s)
    )
    SELECT w.execution_id, w.kind, w.name, w.started_at, w.deadline
    FROM stale s JOIN shardq.waits w ON w.execution_id = s.execution_id
$$;
