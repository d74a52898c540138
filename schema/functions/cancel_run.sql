-- Cancel a run no worker holds, the caller holding its task and executions
-- rows: it ends here, its task and wait go away, a slot of its concurrency
-- key goes back. A run waiting for a person has that interrupt decided as
-- `cancel` (replay stops there), by `p_actor`. Its end then reaches its parent
-- and its children (shardq.runs_ended). A client's cancel (store/queries.sql,
-- cancel_now) and a parent's (deliver_control) both come here.
CREATE OR REPLACE FUNCTION shardq.cancel_run(p_id uuid, p_actor text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    released text;
BEGIN
    DELETE FROM shardq.tasks WHERE execution_id = p_id RETURNING concurrency_key INTO released;
    -- A run waiting for a slot of its concurrency key leaves the queue.
    DELETE FROM shardq.key_queue WHERE execution_id = p_id;
    WITH waits AS (
        DELETE FROM shardq.waits WHERE execution_id = p_id RETURNING position, kind, name
    )
    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    SELECT p_id, w.position, 'interrupt.decided', w.name,
           jsonb_build_object('action', 'cancel', 'payload', NULL, 'decision_id', NULL,
                              'actor', p_actor, 'decided_at', now())
    FROM waits w WHERE w.kind = 'interrupt';
    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    VALUES (p_id, NULL, 'run.cancelled', 'run', '{}');
    INSERT INTO shardq.ended_runs (tenant, state, execution_id, workflow_name)
    SELECT x.tenant, 'cancelled', x.id, x.workflow_name FROM shardq.executions x
    WHERE x.id = p_id;
    IF released IS NOT NULL THEN
        PERFORM shardq.release_slots(ARRAY[released]);
    END IF;
    PERFORM shardq.runs_ended(ARRAY[p_id]);
    RETURN true;
END
$$;
