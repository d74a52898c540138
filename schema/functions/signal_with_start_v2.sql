-- Signal a run, starting it first when its workflow key has none: one
-- transaction on the run's shard. A new run is created with the signal
-- already buffered; a live run takes the signal; a finished one refuses it
-- (unless a keyed repeat), exactly as deliver_signals decides, which this
-- calls for the delivery itself and whose answer it passes on. A new run of a
-- declarative workflow is created with its gates (p_gates), and a new run with
-- p_priority, p_concurrency_key and its limit (an existing run keeps its own; a keyed
-- start declares its key's limit first, shardq.declare_limits).
--
-- Racing callers with one workflow key: the first INSERT wins and the others
-- wait on the unique index until it commits, then find its row (a new
-- statement, a new snapshot) and deliver to it; deliver_signals locks the run,
-- so with one idempotency key exactly one of them delivers.
CREATE OR REPLACE FUNCTION shardq.signal_with_start_v2(
    p_tenant            text,
    p_workflow_name     text,
    p_workflow_version  integer,
    p_workflow_id       text,
    p_new_id            uuid,
    p_input             jsonb,
    p_name              text,
    p_payload           jsonb,
    p_key               text,
    p_max_pending       integer,
    p_max_pending_total integer,
    p_gates             text[],
    p_priority          smallint,
    p_concurrency_key   text,
    p_concurrency_limit integer
) RETURNS TABLE (
    execution_id uuid,
    created      boolean,
    signal_id    bigint,
    earlier_id   bigint,
    earlier_name text,
    reason_code  text,
    detail       text
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    run uuid;
    is_new boolean := false;
    task_build text;
BEGIN
    -- The workflow's current build (schema/0026), as any start.
    INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id,
                                   input, gates, priority, concurrency_key,
                                   concurrency_limit, build_id, pinned)
    SELECT p_new_id, p_tenant, p_workflow_name, p_workflow_version, p_workflow_id, p_input,
           p_gates, p_priority, p_concurrency_key, p_concurrency_limit, b.build_id,
           coalesce(b.pinned, false)
    FROM (SELECT 1) one
    LEFT JOIN shardq.workflow_builds b ON b.workflow_name = p_workflow_name
    ON CONFLICT (tenant, workflow_name, workflow_id) DO NOTHING
    RETURNING id, CASE WHEN pinned THEN build_id END INTO run, task_build;
    IF run IS NOT NULL THEN
        is_new := true;
        -- A keyed run over its limit waits in key_queue (shardq.admit_task).
        INSERT INTO shardq.tasks (execution_id, run_at, priority, concurrency_key, tenant,
                                  build_id)
        VALUES (run, now(), p_priority, p_concurrency_key, p_tenant, task_build);
        PERFORM pg_notify(shardq.wake_channel(), shardq.wake_note(p_priority));
    ELSE
        -- A one-value range in the unique index's order: the probe no plan can
        -- turn into a scan of the workflow's runs (store/queries.sql,
        -- find_executions, says why).
        SELECT x.id INTO run FROM shardq.executions x
        WHERE x.tenant = p_tenant AND x.workflow_name = p_workflow_name
          AND x.workflow_id >= p_workflow_id AND x.workflow_id <= p_workflow_id
        ORDER BY x.workflow_id LIMIT 1;
    END IF;

    RETURN QUERY
    SELECT run, is_new, d.signal_id, d.earlier_id, d.earlier_name, d.reason_code, d.detail
    FROM shardq.deliver_signals(p_tenant, ARRAY[run], ARRAY[p_name], ARRAY[p_payload],
                                ARRAY[p_key], p_max_pending, p_max_pending_total,
                                NULL::text[]) AS d;
END
$$;
