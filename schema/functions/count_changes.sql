-- The net change a statement made to the rows counts are kept of (schema/0029),
-- appended to run_count_changes: one row per (tenant, workflow, kind) whose count
-- it changed, none for a statement that changed none. executions rows count as
-- 'started', ended_runs rows as their state, waits rows as 'waiting' or
-- 'input_required' (an interrupt). An UPDATE (of waits: a run parked again on
-- another kind of wait) is its new rows less its old ones. plpgsql plans only
-- the branches a statement takes, so one function serves every trigger, whatever
-- transition tables it names.
--
-- A waits row knows neither tenant nor workflow: each is probed in executions by
-- its id, one index probe a row (OFFSET 0 keeps the subquery a probe: joined, the
-- planner could choose to hash every run of the shard for a batch of parks).
CREATE OR REPLACE FUNCTION shardq.count_changes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'executions' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
            SELECT a.tenant, a.workflow_name, 'started', count(*) FROM added a GROUP BY 1, 2;
        ELSE
            INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
            SELECT r.tenant, r.workflow_name, 'started', -count(*) FROM removed r GROUP BY 1, 2;
        END IF;
    ELSIF TG_TABLE_NAME = 'ended_runs' THEN
        IF TG_OP = 'INSERT' THEN
            INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
            SELECT a.tenant, a.workflow_name, a.state, count(*) FROM added a GROUP BY 1, 2, 3;
        ELSE
            INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
            SELECT r.tenant, r.workflow_name, r.state, -count(*) FROM removed r
            GROUP BY 1, 2, 3;
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
        SELECT x.tenant, x.workflow_name, shardq.wait_state(a.kind), count(*)
        FROM added a,
             LATERAL (SELECT e.tenant, e.workflow_name FROM shardq.executions e
                      WHERE e.id = a.execution_id OFFSET 0) x
        GROUP BY 1, 2, 3;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
        SELECT x.tenant, x.workflow_name, shardq.wait_state(r.kind), -count(*)
        FROM removed r,
             LATERAL (SELECT e.tenant, e.workflow_name FROM shardq.executions e
                      WHERE e.id = r.execution_id OFFSET 0) x
        GROUP BY 1, 2, 3;
    ELSE
        INSERT INTO shardq.run_count_changes (tenant, workflow_name, kind, n)
        SELECT x.tenant, x.workflow_name, c.state, sum(c.n)
        FROM (SELECT a.execution_id, shardq.wait_state(a.kind) AS state, 1 AS n FROM added a
              UNION ALL
              SELECT r.execution_id, shardq.wait_state(r.kind), -1 FROM removed r) c,
             LATERAL (SELECT e.tenant, e.workflow_name FROM shardq.executions e
                      WHERE e.id = c.execution_id OFFSET 0) x
        GROUP BY 1, 2, 3
        HAVING sum(c.n) <> 0;
    END IF;
    RETURN NULL;
END
$$;
