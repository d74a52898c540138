-- Priorities (docs/flow-control.md): a run's priority, 0 (the default) to 9,
-- higher claimed first. Kept on the run (executions) and on its task row, whose
-- every insert copies the run's, so a run woken by a signal, a decision or a
-- timer is claimed at the priority it was started with.
--
-- Priority 0 costs nothing new: its due tasks are found by tasks_due as
-- before, and the partial index below holds only the rows of priority 1-9,
-- so an insert or delete of a priority-0 task does not touch it. A claim asks
-- it for the highest level first (one probe per level present) and takes the
-- rest of its batch from tasks_due. Columns a claim writes (the lease) are
-- still in no index, so claims stay HOT updates (schema/0018).
--
-- Both columns are constant defaults: PostgreSQL adds them without rewriting
-- either table.
ALTER TABLE shardq.executions
    ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE shardq.tasks
    ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX tasks_urgent ON shardq.tasks (priority DESC, run_at) WHERE priority > 0;

-- signal_with_start_v2 takes the new run's priority, and claim_tasks the lowest
-- level a claim takes (a worker's fast lane for urgent work): their files
-- create them again with the parameter (until a release ships, a function
-- changes in place and a migration drops the signature nothing calls;
-- docs/storage.md).
DROP FUNCTION IF EXISTS shardq.claim_tasks(text, integer, float8);
DROP FUNCTION IF EXISTS shardq.signal_with_start_v2(
    text, text, integer, text, uuid, jsonb, text, jsonb, text, integer, integer, text[]);
