-- shardq's tables on one shard. Every statement that reads or writes them lives
-- in store/queries.sql; this file only shapes them.

-- One row per workflow run. Updated a handful of times in a run's life, so a
-- little free space per page keeps those updates HOT (no index columns change).
CREATE TABLE shardq.executions (
    id               uuid PRIMARY KEY,
    tenant           text NOT NULL,
    workflow_name    text NOT NULL,
    workflow_version integer NOT NULL,
    workflow_id      text NOT NULL,
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN (
                         'pending', 'running', 'waiting', 'input_required',
                         'completed', 'failed', 'cancelled', 'timed_out')),
    input            jsonb NOT NULL,
    output           jsonb,
    error            jsonb,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- The last worker commit that landed, and the attempt (one per batch
    -- transaction) that wrote it: a commit retried after a lost connection
    -- learns whether it landed, and a batch's statements touch only the
    -- executions its own fence admitted.
    commit_token     uuid,
    commit_attempt   uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT executions_workflow_key UNIQUE (tenant, workflow_name, workflow_id)
) WITH (fillfactor = 85);

-- Keyset pagination of `list`: creation time, then id. State is deliberately not
-- indexed: it changes on every turn and would make those updates non-HOT.
CREATE INDEX executions_created ON shardq.executions (created_at, id);

-- Append-only event log, read by replay. `seq` comes from one shard-wide
-- identity so a worker's events and a signal sender's events never collide;
-- `position` is the workflow call an event belongs to (NULL for events that
-- arrive from outside, like a signal being received).
CREATE TABLE shardq.history (
    execution_id uuid NOT NULL,
    seq          bigint GENERATED ALWAYS AS IDENTITY,
    position     integer,
    kind         text NOT NULL,
    name         text NOT NULL,
    payload      jsonb NOT NULL DEFAULT '{}',
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, seq)
);

-- The claimable rows: "this execution can make progress at run_at". A run
-- parked on a signal or an interrupt has no row here, so parked runs cost the
-- claim path nothing. While a lease is held, run_at is the lease expiry: an
-- expired lease is just a due task, and one index serves claims, timers and
-- lease rescue alike. Rows are small, updated on every claim and deleted when
-- a run parks or ends: leave room for HOT updates and vacuum eagerly.
CREATE TABLE shardq.tasks (
    execution_id uuid PRIMARY KEY,
    run_at       timestamptz NOT NULL,
    claims       integer NOT NULL DEFAULT 0,
    lease_owner  text,
    lease_token  uuid
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 10000,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX tasks_due ON shardq.tasks (run_at);

-- Why a parked run is not runnable. At most one open wait per execution: a
-- workflow is sequential. The interrupt request (prompt, actions, schema)
-- lives here while a person is asked.
CREATE TABLE shardq.waits (
    execution_id uuid PRIMARY KEY,
    position     integer NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('timer', 'signal', 'interrupt')),
    name         text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    deadline     timestamptz,
    request      jsonb
) WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02);

-- Named messages to one execution, buffered until a wait consumes them
-- (oldest first). A given idempotency key lands once per execution.
CREATE TABLE shardq.signals (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    execution_id      uuid NOT NULL,
    tenant            text NOT NULL,
    name              text NOT NULL,
    payload           jsonb NOT NULL,
    idempotency_key   text CHECK (idempotency_key <> ''),
    received_at       timestamptz NOT NULL DEFAULT now(),
    consumed_at       timestamptz,
    consumed_position integer
);

CREATE UNIQUE INDEX signals_idempotency ON shardq.signals (execution_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX signals_pending ON shardq.signals (execution_id, id) WHERE consumed_at IS NULL;

-- Signals for executions on other shards, written in the sender's own commit
-- and delivered by the outbox relay.
CREATE TABLE shardq.outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_execution_id uuid NOT NULL,
    source_position     integer NOT NULL,
    target_execution_id uuid NOT NULL,
    tenant              text NOT NULL,
    signal_name         text NOT NULL,
    payload             jsonb NOT NULL,
    idempotency_key     text CHECK (idempotency_key <> ''),
    state               text NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts            integer NOT NULL DEFAULT 0,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    failure_reason      text,
    failure_detail      text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);

CREATE INDEX outbox_due ON shardq.outbox (next_attempt_at) WHERE state = 'pending';
