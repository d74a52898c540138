-- Rate limits (docs/flow-control.md, docs/design/flow-control.md section 2):
-- a named limiter lets `rate` steps start per `period_s` seconds, `burst` of
-- them at once after a quiet spell, across every worker and shard. A step that
-- names a limiter asks for a slot before it runs (shardq.take_rate_slot); over
-- the limit, it is given the next free slot, a time, and its run waits for it
-- on its task row as a retry's backoff does: delayed, never failed.
--
-- Every limiter lives on the map's home shard, whatever shard its runs are on:
-- one row, so one transaction decides each slot, and no move ever carries it.
-- The tables exist on every shard; only the home shard's hold rows.
--
-- A limiter is two GCRA (generic cell rate algorithm) cells, each a time:
-- `tat` plans, `sat` admits. Asking moves tat one interval (period_s / rate) on
-- and gives the call its planned slot, its place in line. Starting moves sat
-- one interval on from the start: a call may start at its planned slot, and no
-- sooner than sat allows. Without sat, calls late for their slots (a fleet busy
-- after a burst) would all start as they caught up, several an interval; with
-- it, starts are spaced by the rate however late they come. Both change on
-- every call and no index holds them: those updates stay HOT.
CREATE TABLE shardq.rate_limiters (
    name       text PRIMARY KEY,
    -- As the workflow code declares it (the worker writes it at start and at
    -- first use), and an operator's (`shardq rates set`), which wins until reset.
    rate       integer NOT NULL CHECK (rate > 0),
    period_s   float8 NOT NULL CHECK (period_s > 0),
    burst      integer NOT NULL CHECK (burst > 0),
    o_rate     integer CHECK (o_rate > 0),
    o_period_s float8 CHECK (o_period_s > 0),
    o_burst    integer CHECK (o_burst > 0),
    tat        timestamptz NOT NULL DEFAULT now(),
    sat        timestamptz NOT NULL DEFAULT now(),
    CHECK ((o_rate IS NULL) = (o_period_s IS NULL) AND (o_rate IS NULL) = (o_burst IS NULL))
) WITH (fillfactor = 50);

-- A slot given to a step that must wait for it: the step's run parks until
-- `at`, and its next turn finds the slot here (keyed by the step's call:
-- position and attempt) instead of taking another. Deleted when the step
-- takes it; one never taken (its run was cancelled) is deleted an hour on.
CREATE TABLE shardq.rate_reservations (
    execution_id uuid NOT NULL,
    position     integer NOT NULL,
    attempt      integer NOT NULL,
    limiter      text NOT NULL,
    at           timestamptz NOT NULL,
    PRIMARY KEY (execution_id, position, attempt, limiter)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
CREATE INDEX rate_reservations_waiting ON shardq.rate_reservations (limiter, at);
