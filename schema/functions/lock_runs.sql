-- Lock these task rows, then these runs' executions rows, each set in id order:
-- the global order every sender and committer takes them in (deliver_signals,
-- commit_turns_v2; tests/integration/test_lock_order.py), so two of them never
-- wait on each other in a cycle. Rows that do not exist are skipped.
--
-- A function of its own so that its plans may be generic (planned once per
-- connection) without a sequential scan: a plan made while the tables are small
-- scans them, and kept while they grow it compares every row with every id. The
-- relay delivering 500 children's starts to a shard that was filling up read
-- 5,000 runs x 500 ids a round, 50 ms of the round's 70.
CREATE OR REPLACE FUNCTION shardq.lock_runs(p_tasks uuid[], p_runs uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
BEGIN
    PERFORM 1 FROM shardq.tasks t WHERE t.execution_id = ANY(p_tasks)
    ORDER BY t.execution_id FOR UPDATE;
    PERFORM 1 FROM shardq.executions x WHERE x.id = ANY(p_runs)
    ORDER BY x.id FOR UPDATE;
END
$$;
