-- Exact counts of runs by tenant, workflow and state, read in a few rows however
-- many runs a shard holds (issue 40, docs/operations.md "Listing and counting
-- runs").
--
-- Every statement that adds or removes executions, ended_runs or waits rows (or
-- changes a wait's kind) appends its net change, one row per (tenant, workflow,
-- kind), to run_count_changes: a statement trigger over its transition tables, so
-- every writer is counted (starts of every kind, commits, parks and wakes,
-- cancels, decisions, purge, a move's copies and its cleanup) and none has to
-- remember to. An append takes no lock another transaction waits for, as an
-- update of a shared counter row would (two commits ending runs of one workflow
-- would queue on it). A worker folds the changes into run_counts every few
-- seconds (shardq.fold_run_counts); a count reads both, so it is exact in its
-- snapshot whether or not the fold ran. kind: 'started', an ended state, or the
-- state an open wait puts a run in (shardq.wait_state) unless a worker holds it.
CREATE TABLE shardq.run_counts (
    tenant        text NOT NULL,
    workflow_name text NOT NULL,
    kind          text NOT NULL,
    n             bigint NOT NULL,
    PRIMARY KEY (tenant, workflow_name, kind)
);

CREATE TABLE shardq.run_count_changes (
    tenant        text NOT NULL,
    workflow_name text NOT NULL,
    kind          text NOT NULL,
    n             bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000);
CREATE INDEX run_count_changes_key ON shardq.run_count_changes (tenant, workflow_name, kind);

INSERT INTO shardq.run_counts (tenant, workflow_name, kind, n)
SELECT tenant, workflow_name, 'started', count(*) FROM shardq.executions GROUP BY 1, 2
UNION ALL
SELECT tenant, workflow_name, state, count(*) FROM shardq.ended_runs GROUP BY 1, 2, 3
UNION ALL
SELECT x.tenant, x.workflow_name,
       CASE WHEN w.kind = 'interrupt' THEN 'input_required' ELSE 'waiting' END, count(*)
FROM shardq.waits w JOIN shardq.executions x ON x.id = w.execution_id GROUP BY 1, 2, 3;

-- The trigger function (schema/functions/count_changes.sql) is made again after the
-- migrations (a shard may hold it already); the triggers need it now.
CREATE OR REPLACE FUNCTION shardq.count_changes() RETURNS trigger LANGUAGE plpgsql
    AS 'BEGIN RETURN NULL; END';
CREATE TRIGGER executions_counted AFTER INSERT ON shardq.executions
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER executions_uncounted AFTER DELETE ON shardq.executions
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER ended_runs_counted AFTER INSERT ON shardq.ended_runs
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER ended_runs_uncounted AFTER DELETE ON shardq.ended_runs
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER waits_counted AFTER INSERT ON shardq.waits
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER waits_uncounted AFTER DELETE ON shardq.waits
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
CREATE TRIGGER waits_recounted AFTER UPDATE ON shardq.waits
    REFERENCING OLD TABLE AS removed NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION shardq.count_changes();
