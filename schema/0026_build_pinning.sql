-- Build pinning (docs/versioning.md, "Builds"): a worker says which build of
-- the code it runs (`shardq worker --build-id`), an operator gives a workflow a
-- current build and a policy, and a run pinned to a build is claimed only by
-- workers of that build until an operator moves it (`shardq workflow
-- migrate-build`).
--
-- A workflow's current build, the same on every shard (the CLI writes each
-- shard, `shardq shards add` copies the rows, as tenant_weights). A start reads
-- it: the run records the build and, under `pinned`, is held to it. No row:
-- runs record no build and any worker claims them, as before builds existed.
CREATE TABLE shardq.workflow_builds (
    workflow_name text PRIMARY KEY,
    build_id      text NOT NULL,
    pinned        boolean NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- A run's build, written by its start and changed only by migrate-build (the
-- executions row stays write-once on every hot path). `pinned`: the run's task
-- rows carry the build, and only that build's workers claim them.
ALTER TABLE shardq.executions ADD COLUMN build_id text;
ALTER TABLE shardq.executions ADD COLUMN pinned boolean NOT NULL DEFAULT false;
-- What `shardq workflow builds` counts and migrate-build moves: the pinned
-- runs of a workflow and build, and no other run.
CREATE INDEX executions_pinned ON shardq.executions (workflow_name, build_id) WHERE pinned;

-- A task row carries its run's pinned build, copied by every insert from the
-- executions row as its tenant is (NULL: any worker). Pinned rows leave the
-- three claim indexes for two of their own, keyed by build first: a worker
-- reads its own build's due rows and never steps over another's, so the due
-- runs of a build no worker runs any more (drained, or not deployed yet) cost
-- the other claims nothing, however many they are.
ALTER TABLE shardq.tasks ADD COLUMN build_id text;
DROP INDEX shardq.tasks_due;
CREATE INDEX tasks_due ON shardq.tasks (run_at) WHERE build_id IS NULL;
DROP INDEX shardq.tasks_fair;
CREATE INDEX tasks_fair ON shardq.tasks (tenant, run_at) WHERE priority = 0 AND build_id IS NULL;
DROP INDEX shardq.tasks_urgent;
CREATE INDEX tasks_urgent ON shardq.tasks (priority DESC, run_at)
    WHERE priority > 0 AND build_id IS NULL;
CREATE INDEX tasks_pinned ON shardq.tasks (build_id, run_at) WHERE build_id IS NOT NULL;
CREATE INDEX tasks_pinned_urgent ON shardq.tasks (build_id, priority DESC, run_at)
    WHERE priority > 0 AND build_id IS NOT NULL;

-- claim_tasks takes the worker's build (a last argument, NULL for a worker
-- without one): its file creates it again.
DROP FUNCTION IF EXISTS shardq.claim_tasks(text, integer, float8, smallint, text);
