-- Listing at the cost of a page (issue 40, docs/design/visibility.md): every filter
-- a page can have is a range of one index that yields its runs already in id
-- order, so a page reads about `limit` entries a shard, however many runs the
-- shard holds, and a filter that matches nothing on a shard reads one descent.
--
-- A tenant's runs, and a tenant's runs of one workflow, in id (creation) order.
-- Ids lead with their millisecond, so both grow at their right edge as the
-- primary key does: two more index entries a start, no page split in the middle.
CREATE INDEX executions_tenant ON shardq.executions (tenant, id);
CREATE INDEX executions_workflow ON shardq.executions (tenant, workflow_name, id);

-- Ended runs by how they ended. A run's state is derived (shardq.run_state), and
-- the ended states live in history rows that know neither tenant nor workflow:
-- a page of one tenant's failed runs would otherwise read every ended run before
-- it. One row a run, written in the transaction that writes its outcome event
-- (commit_turns_v2, cancel_run) and never changed; purge and moves remove it with
-- the run. No index leads with execution_id: the statements that look one up by
-- run join executions for its tenant and name the four states (three columns of
-- the primary key), so an ended run costs two index entries, not three.
CREATE TABLE shardq.ended_runs (
    tenant        text NOT NULL,
    state         text NOT NULL,
    execution_id  uuid NOT NULL,
    workflow_name text NOT NULL,
    PRIMARY KEY (tenant, state, execution_id)
) WITH (fillfactor=100);
CREATE INDEX ended_runs_workflow ON shardq.ended_runs (tenant, workflow_name, state, execution_id);

INSERT INTO shardq.ended_runs (tenant, state, execution_id, workflow_name)
SELECT x.tenant, substr(o.kind, 5), x.id, x.workflow_name
FROM shardq.history o JOIN shardq.executions x ON x.id = o.execution_id
WHERE o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out');
ANALYZE shardq.ended_runs;
