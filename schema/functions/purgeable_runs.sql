-- Finished runs past their retention, oldest first: the workflows in
-- p_workflows when p_listed, every other workflow when not (so one call
-- serves the definitions with a retention of their own, another the default).
-- A run with outbox rows still pending stays: the relay may yet record their
-- fate in its history. A live run never qualifies: only a finished run has
-- an outcome event. p_limit null: no limit (a dry run's count).
CREATE OR REPLACE FUNCTION shardq.purgeable_runs(
    p_retention_s float8,
    p_workflows   text[],
    p_listed      boolean,
    p_limit       integer
) RETURNS TABLE (execution_id uuid)
LANGUAGE sql STABLE AS $$
    SELECT o.execution_id
    FROM shardq.history o
    JOIN shardq.executions x ON x.id = o.execution_id
    WHERE o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
      AND o.recorded_at < now() - make_interval(secs => p_retention_s)
      AND (x.workflow_name = ANY(p_workflows)) = p_listed
      AND NOT EXISTS (SELECT 1 FROM shardq.outbox b
                      WHERE b.source_execution_id = o.execution_id AND b.state = 'pending')
    ORDER BY o.recorded_at
    LIMIT p_limit
$$;
