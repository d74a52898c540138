-- Every statement shardq runs against a shard's queue tables (see schema/).
-- Loaded by queue/store.py; one `-- name:` header per statement.
-- uuid[] parameters go in binary (%(name)b): dumping UUIDs as text cost ~9x more CPU.
--
-- Batch statements find their rows with `= ANY(array)` (an index probe per
-- id) and only then match the unnest()ed values: joined to unnest() directly,
-- the planner hash-joins against a sequential scan of the whole table.
--
-- Lock order, everywhere: tasks row, then executions row. Claims take task
-- rows with SKIP LOCKED only and never lock executions, so they cannot join a
-- deadlock cycle.

-- name: start_executions
-- Insert new runs and their due tasks, and wake the workers once per batch.
-- Keys that already exist are skipped here and read by find_executions.
WITH input AS (
    SELECT *
    FROM unnest(%(ids)b::uuid[], %(workflow_ids)s::text[], %(inputs)s::jsonb[])
        AS i(id, workflow_id, input)
), inserted AS (
    INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id, input)
    SELECT id, %(tenant)s, %(workflow_name)s, %(workflow_version)s, workflow_id, input FROM input
    ON CONFLICT (tenant, workflow_name, workflow_id) DO NOTHING
    RETURNING id, workflow_id
), tasks AS (
    INSERT INTO shardq.tasks (execution_id, run_at)
    SELECT id, now() FROM inserted
), notified AS (
    -- NOTIFY is a hint; one per statement however many rows, none if nothing new.
    SELECT pg_notify(shardq.wake_channel(), '') WHERE EXISTS (SELECT 1 FROM inserted)
)
SELECT i.id, i.workflow_id, 'pending' AS state, true AS created
FROM inserted i LEFT JOIN notified ON true

-- name: find_executions
-- One unique-index probe per key (a plain `= ANY` may scan every run of the
-- workflow when the planner has no statistics yet).
SELECT x.id, x.workflow_id, shardq.run_state(x.id) AS state, false AS created
FROM unnest(%(workflow_ids)s::text[]) AS i(workflow_id)
CROSS JOIN LATERAL (
    SELECT e.id, e.workflow_id FROM shardq.executions e
    WHERE e.tenant = %(tenant)s AND e.workflow_name = %(workflow_name)s
      AND e.workflow_id = i.workflow_id
    OFFSET 0
) x

-- name: notify_wake
SELECT pg_notify(shardq.wake_channel(), '')

-- name: listen_statement
-- The LISTEN for the wake channel, built where the channel's name is defined.
SELECT format('LISTEN %%I', shardq.wake_channel()) AS statement

-- name: claim_tasks
-- Lease up to `limit` due tasks with what replay needs; the last row carries
-- the seconds until the next task is due. Body: schema/functions/claim_tasks.sql.
SELECT * FROM shardq.claim_tasks(%(owner)s, %(limit)s, %(lease_s)s)

-- name: commit_turns
-- A batch of turn commits, fenced by lease tokens, as one JSON document.
-- Body and the document's layout: schema/functions/commit_turns.sql.
SELECT commit_ord, cancel_requested, externals
FROM shardq.commit_turns(%(lease_s)s, %(batch)s::jsonb)

-- name: landed_commits
-- After a lost connection: which commits of the failed attempt had landed.
-- A landed commit retired its lease token (rotated, or the task row gone);
-- one that did not land left it in place. (A lease lost meanwhile also retires
-- it; retrying such a commit could not have written anything either.)
SELECT c.id
FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS c(id, token)
WHERE NOT EXISTS (
    SELECT 1 FROM shardq.tasks t WHERE t.execution_id = c.id AND t.lease_token = c.token
)

-- name: extend_leases
-- Heartbeat. Rows a commit batch holds are skipped, not waited for: that
-- commit is the proof of life, and waiting could deadlock with it.
WITH held AS (
    SELECT t.execution_id
    FROM shardq.tasks t
    WHERE t.execution_id = ANY(%(ids)b::uuid[])
      AND (t.execution_id, t.lease_token) IN (
        SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[])
      )
    ORDER BY t.execution_id
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE shardq.tasks t
SET run_at = now() + make_interval(secs => %(lease_s)s)
FROM held
WHERE t.execution_id = held.execution_id
RETURNING t.execution_id

-- name: release_leases
-- Hand unfinished work back at once (graceful shutdown) instead of at expiry.
WITH held AS (
    SELECT t.execution_id
    FROM shardq.tasks t
    WHERE t.execution_id = ANY(%(ids)b::uuid[])
      AND (t.execution_id, t.lease_token) IN (
        SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[])
      )
    ORDER BY t.execution_id
    FOR UPDATE OF t
)
UPDATE shardq.tasks t
SET run_at = now(), lease_token = NULL, lease_owner = NULL
FROM held
WHERE t.execution_id = held.execution_id
RETURNING t.execution_id

-- name: read_history
SELECT seq, position, kind, name, payload, recorded_at
FROM shardq.history
WHERE execution_id = %(id)s
ORDER BY seq

-- name: lock_task
-- Cancellers (and signal senders, in deliver_signals) lock in the workers' order:
-- task row first, then the executions row. A parked run has no task row; then
-- this locks nothing.
SELECT lease_token IS NOT NULL AND run_at > now() AS leased
FROM shardq.tasks WHERE execution_id = %(id)s FOR UPDATE

-- name: lock_execution
-- Executions rows are never written after start: the lock only serializes
-- cancellers and signal senders to one run.
SELECT tenant, shardq.run_state(id) AS state FROM shardq.executions WHERE id = %(id)s
FOR UPDATE

-- name: deliver_signals
-- One tenant's signals to runs on this shard, in one transaction; a row per
-- signal in input order. Body: schema/functions/deliver_signals.sql.
SELECT ord, tenant, finished, earlier_id, earlier_name, pending, pending_total, signal_id
FROM shardq.deliver_signals(
    %(tenant)s, %(ids)b::uuid[], %(names)s::text[], %(payloads)s::jsonb[], %(keys)s::text[],
    %(max_pending)s, %(max_pending_total)s
)
ORDER BY ord

-- name: signal_with_start
-- Start the run of a workflow key unless it exists, and signal it, in one
-- transaction. Body: schema/functions/signal_with_start.sql.
SELECT execution_id, created, tenant, finished, earlier_id, earlier_name, pending,
       pending_total, signal_id
FROM shardq.signal_with_start(
    %(tenant)s, %(workflow_name)s, %(workflow_version)s, %(workflow_id)s, %(new_id)s,
    %(input)s::jsonb, %(name)s, %(payload)s::jsonb, %(key)s, %(max_pending)s,
    %(max_pending_total)s
)

-- name: open_wait
SELECT kind, name, started_at, deadline, request FROM shardq.waits
WHERE execution_id = %(id)s

-- name: pending_signals
-- Signals buffered for a run, oldest first (at most the pending bound).
SELECT id, name, payload, idempotency_key, received_at FROM shardq.signals
WHERE execution_id = %(id)s AND consumed_at IS NULL
ORDER BY id

-- name: cancel_now
-- Cancel a run no worker holds: it ends here, its task and wait go away.
WITH tasks AS (
    DELETE FROM shardq.tasks WHERE execution_id = %(id)s
), waits AS (
    DELETE FROM shardq.waits WHERE execution_id = %(id)s
)
INSERT INTO shardq.history (execution_id, position, kind, name, payload)
VALUES (%(id)s, NULL, 'run.cancelled', 'run', '{}')

-- name: request_cancel
-- A worker holds the run: it ends cancelled at that worker's next commit
-- that is not a mid-turn checkpoint (a checkpoint makes it stop at its next
-- workflow call).
UPDATE shardq.tasks SET cancel_requested = true WHERE execution_id = %(id)s
