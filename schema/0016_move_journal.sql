-- The mover's state (growing, build step 6; docs/design/growing.md, section 4).
--
-- Created on every shard, used on two kinds: the journal (moves, move_batches)
-- on the home shard only, since only one mover runs per deployment and it
-- holds its lock there; applied_batches on whichever shard is a move's target.
-- Keeping one schema everywhere means any shard can become home or target
-- without a migration of its own.

-- The proof a batch switched: inserted on the target in the same transaction
-- as the copied rows and the ownership bits. Who owns a batch is decided by
-- this row alone (present on the target: the target; absent: the source), so
-- a mover killed at any point finds out from the target, not from a journal
-- that may lag it by one step.
CREATE TABLE shardq.applied_batches (
    move_id     bigint NOT NULL,
    batch       integer NOT NULL,
    map_version bigint NOT NULL,
    switched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (move_id, batch)
);

-- One row per `shardq shards move`. A finished move stays as history; a move
-- in phase 'moving' or 'cleaning' is unfinished, and a new move is refused
-- until it is resumed or aborted.
CREATE TABLE shardq.moves (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    first_bucket   smallint NOT NULL CHECK (first_bucket BETWEEN 0 AND 4095),
    last_bucket    smallint NOT NULL CHECK (last_bucket BETWEEN first_bucket AND 4095),
    source         text NOT NULL,
    target         text NOT NULL CHECK (target <> source),
    phase          text NOT NULL CHECK (phase IN ('moving', 'cleaning', 'done', 'aborted')),
    from_version   bigint NOT NULL,
    max_batch_runs integer NOT NULL CHECK (max_batch_runs > 0),
    max_batch_rows integer NOT NULL CHECK (max_batch_rows > 0),
    -- Seconds between a batch's release and the deletion of the source's copy:
    -- readers that planned with the previous version finish against it.
    grace_s        double precision NOT NULL CHECK (grace_s >= 0),
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz
);
-- At most one unfinished move: the mover's lock serializes movers, this keeps
-- a second one from being journaled past a mover that died.
CREATE UNIQUE INDEX moves_unfinished ON shardq.moves ((true))
    WHERE phase IN ('moving', 'cleaning');

-- The batches of a move: whole contiguous buckets, planned from the source's
-- run counts. The phase is what the mover last wrote before acting on the
-- next step; the shards' own state (ownership bits, applied_batches) decides
-- what a re-run does.
CREATE TABLE shardq.move_batches (
    move_id      bigint NOT NULL REFERENCES shardq.moves (id),
    batch        integer NOT NULL CHECK (batch >= 0),
    first_bucket smallint NOT NULL,
    last_bucket  smallint NOT NULL,
    phase        text NOT NULL CHECK (phase IN
        ('planned', 'fenced', 'switched', 'released', 'cleaned', 'rolled_back')),
    planned_runs integer NOT NULL,
    planned_rows bigint NOT NULL,
    runs         integer,      -- copied
    rows_copied  bigint,       -- over the six tables
    -- From the freeze's commit on the source to the switch's commit on the
    -- target: how long writes to the batch's runs were refused.
    paused_ms    integer,
    map_version  bigint,       -- the version its switch created
    released_at  timestamptz,
    PRIMARY KEY (move_id, batch),
    CHECK (first_bucket <= last_bucket)
);
