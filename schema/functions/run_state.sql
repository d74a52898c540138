-- A run's state, read from where it lives (see schema/0005's header): its
-- outcome event once finished, else its task row's lease, else its open
-- wait, else pending. Three primary-key or partial-index probes. A lease
-- whose expiry passed counts as not held: the run is due for another worker.
-- Only meaningful for a run that exists.
--
-- plpgsql, not sql: a query in an SQL function that is not inlined (this one
-- has subqueries) is planned again by every statement that calls it, about
-- 0.2 ms of a read of one run on PostgreSQL 15; plpgsql keeps its plans for
-- the session (measured: Client.get 0.8 ms -> 0.4 ms).
CREATE OR REPLACE FUNCTION shardq.run_state(run uuid) RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce(
        (SELECT substr(o.kind, 5) FROM shardq.history o
         WHERE o.execution_id = run
           AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')),
        (SELECT 'running' FROM shardq.tasks t
         WHERE t.execution_id = run AND t.leased_until > now()),
        (SELECT CASE w.kind WHEN 'interrupt' THEN 'input_required' ELSE 'waiting' END
         FROM shardq.waits w WHERE w.execution_id = run),
        'pending');
END
$$;
