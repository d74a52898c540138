-- A run's state moves out of the wide executions row, which is now written
-- once, at start, and never again.
--
-- Measured on bare loops (2 processes x 2 shards, k = 100, 20,000 one-step
-- jobs, ratios to a raw SKIP LOCKED queue in the same round): claim + fenced
-- DELETE of the task + one history INSERT reached 0.46-0.57; the same with an
-- UPDATE of executions (state, output, finished_at) 0.27-0.32. That UPDATE
-- alone cost ~34 us of server CPU, ~530 bytes of WAL and ~2.4 index entries
-- per job: a claim batch holds consecutive runs, so few of the updates found
-- room on their page (HOT), and the heap doubled in one pass.
--
-- Where a run's state lives instead, each in a row the hot path writes anyway:
--   finished (completed, failed, cancelled, timed_out): its last history
--     event, `run.<state>`, carrying the output or the error; recorded_at is
--     when it finished.
--   running: its task row is leased (lease_owner set, run_at = lease expiry in
--     the future).
--   waiting / input_required: it has an open wait (kind interrupt: input
--     required), and no lease.
--   pending: a task row, no lease, no open wait.
-- A cancellation asked of a leased run is a flag on its task row.
--
-- Releases before this one read and write the dropped columns: stop their
-- workers and clients before migrating. For the same reason the functions
-- whose answers change keep their names: they are dropped here and created
-- anew from schema/functions/ right after.

DROP FUNCTION IF EXISTS shardq.claim_tasks(text, integer, float8);
DROP FUNCTION IF EXISTS shardq.deliver_signals(text, uuid[], text[], jsonb[], text[], integer);
DROP FUNCTION IF EXISTS shardq.commit_turns(float8, jsonb);

INSERT INTO shardq.history (execution_id, position, kind, name, payload, recorded_at)
SELECT x.id, NULL, 'run.' || x.state, 'run',
       CASE WHEN x.state = 'completed' THEN jsonb_build_object('output', x.output)
            WHEN x.error IS NOT NULL THEN jsonb_build_object('error', x.error)
            ELSE '{}'::jsonb END,
       coalesce(x.finished_at, x.updated_at)
FROM shardq.executions x
WHERE x.state IN ('completed', 'failed', 'cancelled', 'timed_out');

ALTER TABLE shardq.tasks ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
UPDATE shardq.tasks t SET cancel_requested = true
FROM shardq.executions x WHERE x.id = t.execution_id AND x.cancel_requested;
-- A task row with claims = 0 is a run's first: it has no history to replay.
-- Task rows inserted later (a woken run) start at 1.
UPDATE shardq.tasks t SET claims = 1
FROM shardq.executions x WHERE x.id = t.execution_id AND x.state <> 'pending' AND t.claims = 0;

-- Finished runs by state, and one probe for whether a run finished.
CREATE INDEX history_outcome ON shardq.history (execution_id, kind)
    WHERE kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out');

ALTER TABLE shardq.executions
    DROP COLUMN state,
    DROP COLUMN output,
    DROP COLUMN error,
    DROP COLUMN cancel_requested,
    DROP COLUMN commit_token,
    DROP COLUMN updated_at,
    DROP COLUMN finished_at;
-- Inserted once, never updated: no room to leave for HOT updates. Listing
-- pages follow the id, which starts with the creation millisecond.
ALTER TABLE shardq.executions SET (fillfactor = 100);
DROP INDEX shardq.executions_created;
