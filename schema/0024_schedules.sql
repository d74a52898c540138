-- Schedules (docs/schedules.md): a named clock that starts runs of a workflow,
-- by a cron expression in a time zone or every so many seconds. Every schedule
-- lives on the map's home shard, as rate limiters do (schema/0022): one row,
-- so one transaction decides each tick, and no move ever carries it; the
-- table exists on every shard, only the home shard's holds rows.
--
-- No scheduler process: every worker's ticker claims due rows (FOR UPDATE SKIP
-- LOCKED, so each is taken by one worker at a time), starts the runs of their
-- due ticks on the runs' own shards, and moves the row on in the same
-- transaction. A tick's run has a workflow id made of the schedule's name and
-- the tick's time: a ticker that dies after the start and before its commit
-- leaves the row as it was, and the next one finds the run already there.
-- Times come from this shard's clock (next_at, the claim's now()), never from
-- a worker's.
CREATE TABLE shardq.schedules (
    name          text PRIMARY KEY,
    tenant        text NOT NULL,
    workflow_name text NOT NULL,
    input         jsonb NOT NULL,
    -- One of the two: a cron expression read in `timezone`, or an interval.
    cron          text,
    every_s       float8 CHECK (every_s > 0),
    timezone      text NOT NULL,
    overlap       text NOT NULL CHECK (overlap IN ('skip', 'buffer_one', 'allow')),
    catchup_s     float8 NOT NULL CHECK (catchup_s >= 0),
    paused        boolean NOT NULL DEFAULT false,
    -- The next tick; NULL when the expression fires no more.
    next_at       timestamptz,
    -- A tick held by buffer_one until the last run ends, and a trigger asked
    -- by an operator (`shardq schedule trigger`), each started by a ticker.
    buffered_at   timestamptz,
    triggered_at  timestamptz,
    last_tick     timestamptz,
    last_run      uuid,
    started       bigint NOT NULL DEFAULT 0,
    skipped       bigint NOT NULL DEFAULT 0,
    missed        bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_s IS NULL))
) WITH (fillfactor = 70);

CREATE INDEX schedules_due ON shardq.schedules (next_at) WHERE NOT paused;

-- Rows a ticker must look at besides the due ones: a tick held by buffer_one,
-- an operator's trigger. Few at any time.
CREATE INDEX schedules_held ON shardq.schedules (name)
    WHERE buffered_at IS NOT NULL OR triggered_at IS NOT NULL;
