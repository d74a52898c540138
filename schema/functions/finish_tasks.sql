-- The fence and the end of a batch of runs that all finish (commit_turns_v2's
-- fused path): delete each task row still leased with its commit's token, and
-- answer the rows deleted, with the concurrency key of each limited one, whose
-- slot the caller gives back for the whole batch (release_slots.sql).
-- Deleting is what fences them: the DELETE locks each row once, where locking
-- first (`FOR UPDATE`, a heap LOCK record of its own) and deleting later
-- writes the row twice (docs/design/db-cost.md, "D").
--
-- In id order, like every other taker of task-row locks: a signal sender
-- (deliver_signals) locks its targets in id order, and a DELETE that took
-- T_high before waiting on T_low would close a cycle with it. A DELETE locks
-- in the order its scan returns rows, and only an index scan of tasks_pkey
-- returns them in id order (the array's keys sorted); a sequential or bitmap
-- scan returns them in heap order, and a generic plan made while the table is
-- small picks one of those. So the two are off for this function's plans
-- (tests/integration/test_lock_order.py holds the rows in reverse heap order).
CREATE OR REPLACE FUNCTION shardq.finish_tasks(ids uuid[], tokens uuid[])
RETURNS TABLE (execution_id uuid, cancel_requested boolean, concurrency_key text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    DELETE FROM shardq.tasks t
    WHERE t.execution_id = ANY(ids)
      AND t.lease_token = tokens[array_position(ids, t.execution_id)]
    RETURNING t.execution_id, t.cancel_requested, t.concurrency_key;
END
$$;
