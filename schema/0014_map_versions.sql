-- Map versions and each shard's ownership of buckets: the state that moving
-- bucket ranges between shards online rests on (docs/design/growing.md,
-- section 3, build step 1). `shardq migrate` records version 1 here, from the
-- map it migrates with; nothing reads these tables yet, so no write or read
-- path changes with this migration.

-- Every version of the map, on every shard, so a process can learn the map
-- from any shard it reaches (the one that refused it, later) and no single
-- catalog database becomes a point of failure for routing. URLs are stored
-- without passwords: a table every shard copies is no place for credentials.
CREATE TABLE shardq.shard_maps (
    version    bigint PRIMARY KEY CHECK (version > 0),
    -- {"buckets": 4096, "home": NAME, "shards": [{"name", "url"}, ...],
    --  "ranges": [[first, last, NAME], ...]}, the ranges covering 0..4095 once.
    layout     jsonb NOT NULL CHECK (jsonb_typeof(layout) = 'object'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One row: which buckets this shard accepts writes for. Only this shard's own
-- row decides that, read in the writing transaction (build step 3): no other
-- database, and no process's map, is trusted with it.
--
-- The design's `draining` bitmap is left out: only the mover's drain phase
-- (build step 6) sets it and only its claim filter reads it, and a one-row
-- table takes a column in that step's migration at no cost. `fence_move` and
-- `fence_target` stay because the `fenced` refusals of step 3 answer with them.
CREATE TABLE shardq.ownership (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Minted with version 1 and the same on every shard: two deployments whose
    -- maps look alike (same names and ranges) are told apart by it.
    deployment   uuid NOT NULL,
    -- The newest version this shard took part in. A refusal will carry it, and
    -- the refused process reads that version here: the key makes sure it exists.
    map_version  bigint NOT NULL REFERENCES shardq.shard_maps (version),
    -- Bit b (get_bit counts from the left) set: bucket b accepts writes.
    writable     bit(4096) NOT NULL,
    -- Writable, or frozen by a move off this shard: a write to an owned bucket
    -- that is not writable waits for the move, one to a bucket not owned goes
    -- to another shard.
    owned        bit(4096) NOT NULL,
    -- True while this shard holds rows of a bucket it cannot write; only then
    -- do per-id checks run, so a clean shard's writes pay one read of this row.
    unclean      boolean NOT NULL DEFAULT false,
    -- The move frozen buckets are going to, and its target shard's name.
    fence_move   bigint,
    fence_target text,
    CONSTRAINT ownership_writable_is_owned CHECK (bit_count(writable & ~owned) = 0),
    CONSTRAINT ownership_fence_names_both CHECK ((fence_move IS NULL) = (fence_target IS NULL))
);
