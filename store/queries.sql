-- Every statement shardq runs against a shard's queue tables (see schema/).
-- Loaded by store/store.py; one `-- name:` header per statement.
-- uuid[] parameters go in binary (%(name)b): dumping UUIDs as text cost ~9x more CPU;
-- so do the big arrays of a batch start and of a ticker's round (text[], jsonb[] from
-- text, timestamptz[]: 10,000 timestamps and names dumped in 28 ms instead of 233).
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
-- Refused whole (shardq.fence) when one id's bucket is not writable here.
WITH input AS (
    SELECT *
    FROM unnest(%(ids)b::uuid[], %(workflow_ids)b::text[], %(inputs)b::jsonb[],
                %(concurrency_keys)b::text[], %(concurrency_limits)b::int[])
        AS i(id, workflow_id, input, concurrency_key, concurrency_limit)
    WHERE (SELECT shardq.fence(%(ids)b::uuid[]))
), inserted AS (
    -- The runs record their workflow's current build, and are held to it when
    -- it is pinned (schema/0026): one probe of a table of a row per workflow.
    INSERT INTO shardq.executions
        (id, tenant, workflow_name, workflow_version, workflow_id, input, gates, priority,
         concurrency_key, concurrency_limit, trace, build_id, pinned)
    SELECT i.id, %(tenant)s, %(workflow_name)s, %(workflow_version)s, i.workflow_id, i.input,
           %(gates)s::text[], %(priority)s, i.concurrency_key, i.concurrency_limit, %(trace)s,
           b.build_id, coalesce(b.pinned, false)
    FROM input i
    LEFT JOIN shardq.workflow_builds b ON b.workflow_name = %(workflow_name)s
    ON CONFLICT (tenant, workflow_name, workflow_id) DO NOTHING
    RETURNING id, workflow_id, concurrency_key, CASE WHEN pinned THEN build_id END AS build_id
), tasks AS (
    -- A keyed run over its key's limit waits in key_queue instead (shardq.admit_task,
    -- which reads the limits declare_limits wrote just before).
    INSERT INTO shardq.tasks (execution_id, run_at, priority, concurrency_key, tenant, build_id)
    SELECT id, now(), %(priority)s, concurrency_key, %(tenant)s, build_id FROM inserted
), notified AS (
    -- NOTIFY is a hint; one per statement however many rows, none if nothing new.
    -- 'urgent' for runs of a priority: a worker claims those without waiting for a
    -- full batch of free slots (schema/functions/claim_tasks.sql).
    SELECT pg_notify(shardq.wake_channel(), shardq.wake_note(%(priority)s))
    WHERE EXISTS (SELECT 1 FROM inserted)
)
SELECT i.id, i.workflow_id, 'pending' AS state, true AS created
FROM inserted i LEFT JOIN notified ON true

-- name: declare_limits
-- The concurrency limits a batch of keyed starts declares, committed before the
-- start (whose admission reads them). Body: schema/functions/declare_limits.sql.
SELECT shardq.declare_limits(%(keys)s::text[], %(buckets)s::int[], %(limits)s::int[],
                             %(probes)b::uuid[])

-- name: concurrency_limit
-- One concurrency key: its limits, its runs holding a slot, its runs waiting.
-- `probe`: an id of the key's bucket, refused when this shard does not own it.
SELECT k.key, k.declared, k.override, k.held AS running,
       (SELECT count(*) FROM shardq.key_queue q WHERE q.concurrency_key = k.key) AS waiting
FROM shardq.concurrency_keys k
WHERE k.key = %(key)s AND (SELECT shardq.owns(ARRAY[%(probe)s::uuid]))

-- name: set_concurrency_limit
-- An operator's limit for a key, or NULL to go back to the declared one; the
-- key's row as it now is. Body: schema/functions/set_concurrency_limit.sql.
SELECT key, declared, override, running, waiting
FROM shardq.set_concurrency_limit(%(key)s, %(override)s, %(probe)s)

-- name: busiest_keys
-- The keys of this shard's buckets with the most runs waiting for a slot.
-- Reads the whole queue: an operator's question, not a scrape's.
SELECT k.key, k.declared, k.override, k.held AS running, w.waiting
FROM (SELECT q.concurrency_key, count(*) AS waiting FROM shardq.key_queue q
      WHERE (SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
         OR get_bit(%(mine)s::bit(4096), shardq.bucket(q.execution_id)) = 1
      GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT %(limit)s) w
JOIN shardq.concurrency_keys k ON k.key = w.concurrency_key
ORDER BY w.waiting DESC, k.key

-- name: tenant_weights
-- The weights an operator gave tenants on this shard (schema/0021); a tenant
-- with no row weighs 1.
SELECT tenant, weight FROM shardq.tenant_weights ORDER BY tenant

-- name: set_tenant_weight
-- An operator's weight for a tenant, or NULL to go back to 1 (the row goes).
WITH gone AS (
    DELETE FROM shardq.tenant_weights WHERE tenant = %(tenant)s AND %(weight)s::int IS NULL
)
INSERT INTO shardq.tenant_weights AS w (tenant, weight)
SELECT %(tenant)s, %(weight)s::int WHERE %(weight)s::int IS NOT NULL
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight, updated_at = now()

-- name: take_rate_slot
-- The seconds until a step's call may start under its rate limiter; NULL when
-- this (the home) shard has no such limiter. Body:
-- schema/functions/take_rate_slot.sql.
SELECT shardq.take_rate_slot(%(limiter)s, %(run)s, %(position)s, %(attempt)s,
                             %(park_after)s) AS wait_s

-- name: declare_rate_limiters
-- The limiters a worker's workflow code declares, written to the home shard at
-- its start and when a step finds its limiter missing. An operator's setting
-- and the slots taken (tat) are left as they are.
INSERT INTO shardq.rate_limiters AS l (name, rate, period_s, burst)
SELECT * FROM unnest(%(names)s::text[], %(rates)s::int[], %(periods)s::float8[],
                     %(bursts)s::int[])
ON CONFLICT (name) DO UPDATE
SET rate = excluded.rate, period_s = excluded.period_s, burst = excluded.burst
WHERE (l.rate, l.period_s, l.burst) IS DISTINCT FROM
      (excluded.rate, excluded.period_s, excluded.burst)

-- name: rate_limiters
-- Every limiter (or one, by name), with the steps waiting for a slot and how far
-- ahead its slots are given (tat - now: a step asking now waits about that long).
SELECT l.name, l.rate, l.period_s, l.burst, l.o_rate, l.o_period_s, l.o_burst,
       greatest(extract(epoch FROM l.tat - now()), 0)::float8 AS backlog_s,
       (SELECT count(*) FROM shardq.rate_reservations r
        WHERE r.limiter = l.name AND r.at > now() - interval '1 hour') AS waiting
FROM shardq.rate_limiters l
WHERE %(name)s::text IS NULL OR l.name = %(name)s
ORDER BY l.name

-- name: set_rate_limit
-- An operator's rate for a limiter (all three NULL: back to the declared one);
-- the limiter as it now is, nothing when no worker has declared it. The next
-- start may come at once: the interval the last start set was the old rate's.
UPDATE shardq.rate_limiters l
SET o_rate = %(rate)s, o_period_s = %(period_s)s, o_burst = %(burst)s,
    sat = least(l.sat, now())
WHERE l.name = %(name)s
RETURNING l.name, l.rate, l.period_s, l.burst, l.o_rate, l.o_period_s, l.o_burst,
          greatest(extract(epoch FROM l.tat - now()), 0)::float8 AS backlog_s,
          (SELECT count(*) FROM shardq.rate_reservations r
           WHERE r.limiter = l.name AND r.at > now() - interval '1 hour') AS waiting

-- name: rate_reservations_of
-- The slot a run is parked for, if any (workflow show, the HTTP run view).
SELECT r.limiter, r.at FROM shardq.rate_reservations r
WHERE r.execution_id = %(id)s AND r.at > now()
ORDER BY r.at LIMIT 1

-- name: concurrency_waiting
-- Runs waiting for a slot, and the keys they wait on (shardq_concurrency_waiting).
SELECT count(*) AS runs, count(DISTINCT q.concurrency_key) AS keys
FROM shardq.key_queue q
WHERE (SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
   OR get_bit(%(mine)s::bit(4096), shardq.bucket(q.execution_id)) = 1

-- name: tenants_due
-- Tenants with unpinned runs due now at priority 0 and not running
-- (shardq_tenants_due; pinned runs are not shared between tenants): the claim's walk over tasks_fair, one descent per tenant, at most 10,000.
WITH RECURSIVE walk(tenant, n) AS (
    (SELECT t.tenant, 1 FROM shardq.tasks t WHERE t.priority = 0 AND t.build_id IS NULL
     ORDER BY t.tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT t.tenant FROM shardq.tasks t
            WHERE t.priority = 0 AND t.build_id IS NULL AND t.tenant > w.tenant
            ORDER BY t.tenant LIMIT 1), w.n + 1
    FROM walk w WHERE w.tenant IS NOT NULL AND w.n < 10000
)
SELECT count(*) AS n FROM walk w
WHERE w.tenant IS NOT NULL AND EXISTS (
    SELECT 1 FROM shardq.tasks t
    WHERE t.priority = 0 AND t.build_id IS NULL AND t.tenant = w.tenant AND t.run_at <= now()
      AND (t.leased_until IS NULL OR t.leased_until <= now()))

-- name: find_executions
-- One probe of executions_workflow_key per key (a plain `= ANY` may scan every
-- run of the workflow when the planner has no statistics yet). The key is a
-- one-value range read in its order, LIMIT 1: without statistics,
-- executions_workflow (tenant, workflow_name, id) looks as cheap for an
-- equality, and read that way every probe scanned every run of the workflow
-- (1,000 keys among 30,000 runs: 4.7 s, not 7 ms); only the unique index
-- yields the range in order, so no plan but a probe of it is cheapest. A key's
-- bucket is its run's (`probes`: an id minted for each key's bucket), and a
-- lookup refuses a bucket this shard does not own, found or not (shardq.owns as
-- a one-time filter): a reader whose map is older than a move follows it,
-- instead of finding the copy the source keeps until its cleanup, or nothing
-- once it is cleaned.
SELECT x.id, x.workflow_id, shardq.run_state(x.id) AS state, false AS created
FROM unnest(%(workflow_ids)s::text[]) AS i(workflow_id)
CROSS JOIN LATERAL (
    SELECT e.id, e.workflow_id FROM shardq.executions e
    WHERE e.tenant = %(tenant)s AND e.workflow_name = %(workflow_name)s
      AND e.workflow_id >= i.workflow_id AND e.workflow_id <= i.workflow_id
    ORDER BY e.workflow_id LIMIT 1
) x
WHERE (SELECT shardq.owns(%(probes)s::uuid[]))

-- name: notify_wake
SELECT pg_notify(shardq.wake_channel(), '')

-- name: ping
-- A round trip that reads nothing: a LISTEN connection's check that its server still answers.
SELECT 1 AS alive

-- name: listen_statement
-- The LISTEN for the wake channel, built where the channel's name is defined.
SELECT shardq.wake_channel() AS channel, format('LISTEN %%I', shardq.wake_channel()) AS statement

-- name: claim_tasks
-- Lease up to `limit` due tasks with what replay needs; the last row carries
-- the seconds until the next task is due and, as its tenant, where the next
-- claim's walk over tenants starts. Body: schema/functions/claim_tasks.sql.
SELECT * FROM shardq.claim_tasks(%(owner)s, %(limit)s, %(lease_s)s, %(min_priority)s::smallint,
                                 %(after_tenant)s, %(build)s)

-- name: commit_turns
-- A batch of turn commits, fenced by lease tokens. Each column travels as one
-- text: ids, names and numbers delimited by commas (`-` for NULL; names never
-- hold either), JSON values as one JSON array. One array parameter per column
-- cost the driver ~2.5 us each per call (~150 us for a lone checkpoint), a
-- JSON document of rows cost the server a jsonb pass per value; text costs
-- neither. Body and the columns: schema/functions/commit_turns_v2.sql. The
-- query is named for what it does, the function for its version: a signature
-- change is a new function beside the old (docs/storage.md, "SQL functions and
-- rolling deploys"), and only this statement follows it.
SELECT commit_ord, cancel_requested, externals
FROM shardq.commit_turns_v2(
    %(lease_s)s,
    string_to_array(%(c_ids)s, ',')::uuid[],
    string_to_array(%(c_tokens)s, ',')::uuid[],
    string_to_array(%(c_next)s, ',')::uuid[],
    string_to_array(%(c_states)s, ',', '-'),
    ARRAY(SELECT v->'v' FROM jsonb_array_elements(%(c_outputs)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i),
    ARRAY(SELECT nullif(v, 'null') FROM jsonb_array_elements(%(c_errors)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i),
    string_to_array(%(c_actions)s, ','),
    string_to_array(%(c_delays)s, ',')::float8[],
    string_to_array(%(c_close_wait)s, ',')::boolean[],
    string_to_array(%(e_ids)s, ',')::uuid[],
    string_to_array(%(e_positions)s, ',', '-')::integer[],
    string_to_array(%(e_kinds)s, ','),
    string_to_array(%(e_names)s, ','),
    ARRAY(SELECT v FROM jsonb_array_elements(%(e_payloads)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i),
    string_to_array(%(e_wake_ins)s, ',', '-')::float8[],
    string_to_array(%(w_ids)s, ',')::uuid[],
    string_to_array(%(w_positions)s, ',')::integer[],
    string_to_array(%(w_kinds)s, ','),
    string_to_array(%(w_names)s, ','),
    string_to_array(%(w_deadline_ins)s, ',', '-')::float8[],
    ARRAY(SELECT nullif(v, 'null') FROM jsonb_array_elements(%(w_requests)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i),
    string_to_array(%(s_ids)s, ',')::bigint[],
    string_to_array(%(s_positions)s, ',')::integer[],
    string_to_array(%(p_ids)s, ',')::uuid[],
    string_to_array(%(p_names)s, ','),
    %(rare)s::jsonb,
    ARRAY(SELECT nullif(v, 'null') FROM jsonb_array_elements(%(c_steps)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i)
)

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
-- commit is the proof of life, and waiting could deadlock with it. A run a
-- move froze is skipped too: its lease is lost (the commit would be refused).
-- run_at moves to the expiry too: a turn that outlived a heartbeat leaves the
-- head of tasks_due, where every claim would step over it (schema/0018). That
-- makes the heartbeat's update a new row version; the claim's stays HOT.
WITH held AS (
    SELECT t.execution_id
    FROM shardq.tasks t
    WHERE t.execution_id = ANY(%(ids)b::uuid[])
      AND (t.execution_id, t.lease_token) IN (
        SELECT * FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[])
      )
      AND ((SELECT shardq.unclean_writable()) IS NULL
           OR get_bit((SELECT shardq.unclean_writable()), shardq.bucket(t.execution_id)) = 1)
    ORDER BY t.execution_id
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE shardq.tasks t
SET leased_until = now() + make_interval(secs => %(lease_s)s),
    run_at = now() + make_interval(secs => %(lease_s)s)
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
SET run_at = now(), lease_token = NULL, lease_owner = NULL, leased_until = NULL
FROM held
WHERE t.execution_id = held.execution_id
RETURNING t.execution_id

-- name: executions_of
-- Runs by id with their derived state, outcome and search attributes, in id order:
-- one run read by id (`fenced`), and the rows of a listing page whose ids
-- store/listing.py found (not fenced: those ids are of the buckets the reader's map
-- gives this shard). A fenced read refuses a bucket this shard does not own
-- (shardq.owns): a reader routed by a map older than a move follows it. Each row's
-- task and attributes are probes of their own, not joins the planner could answer
-- by hashing every task.
SELECT x.id, x.tenant, x.workflow_name, x.workflow_version, x.workflow_id, x.input,
       x.created_at, x.priority, shardq.run_state(x.id) AS state, o.payload->'output' AS output,
       o.payload->'error' AS error, o.recorded_at AS finished_at,
       coalesce((SELECT t.cancel_requested FROM shardq.tasks t WHERE t.execution_id = x.id),
                false) AS cancel_requested,
       x.concurrency_key, x.build_id, x.pinned, x.concurrency_key IS NOT NULL AND EXISTS (
           SELECT 1 FROM shardq.key_queue q WHERE q.execution_id = x.id) AS waiting_for_slot,
       (SELECT jsonb_object_agg(a.name, a.value) FROM shardq.run_attributes a
        WHERE a.execution_id = x.id) AS attributes
FROM unnest(%(ids)s::uuid[]) AS page(id)
JOIN shardq.executions x ON x.id = page.id
LEFT JOIN LATERAL (
    SELECT h.payload, h.recorded_at FROM shardq.history h
    WHERE h.execution_id = x.id
      AND h.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
) o ON true
WHERE NOT %(fenced)s OR (SELECT shardq.owns(%(ids)s::uuid[]))
ORDER BY x.id

-- name: outbox_of
-- A run's outbox rows on one shard, for its page in the run explorer: those it sent
-- (on its own shard, by outbox_source) and those sent to it (on any shard). Delivered
-- rows are deleted, so both are what is still on its way or failed for good; the
-- rows sent to it are found among what the shard still owes anyone (no index leads
-- with the target: the table holds the undelivered only). A page's worth at most.
SELECT id, source_execution_id, source_position, target_execution_id, signal_name, state,
       attempts, next_attempt_at, failure_reason, queued_at
FROM shardq.outbox
WHERE tenant = %(tenant)s AND (source_execution_id = %(id)s OR target_execution_id = %(id)s)
ORDER BY id
LIMIT 200

-- name: read_history
-- One row per event: shardq.events unfolds a finished run's last step from
-- its outcome row (schema/0017).
SELECT seq, position, kind, name, payload, recorded_at
FROM shardq.events
WHERE execution_id = %(id)s AND (SELECT shardq.owns(ARRAY[%(id)s::uuid]))
ORDER BY seq

-- name: read_histories
-- The events of a page of runs at once, by run then seq (`shardq replay` reads a
-- listing page's runs so: one statement, not one per run).
SELECT execution_id, seq, position, kind, name, payload, recorded_at
FROM shardq.events
WHERE execution_id = ANY(%(ids)s)
ORDER BY execution_id, seq

-- name: fence_run
-- Refuses (shardq.fence) unless the run's bucket is writable on this shard.
SELECT shardq.fence(ARRAY[%(id)s::uuid])

-- name: lock_task
-- Cancellers (and signal senders, in deliver_signals) lock in the workers' order:
-- task row first, then the executions row. A parked run has no task row; then
-- this locks nothing.
SELECT coalesce(leased_until > now(), false) AS leased
FROM shardq.tasks WHERE execution_id = %(id)s FOR UPDATE

-- name: task_exists
-- Asked by a canceller holding the executions row, whose lock_task found none:
-- a row now means a sender made the run due in between (it held the executions
-- row to do so, and has committed). Not locked: see Store.cancel.
SELECT 1 FROM shardq.tasks WHERE execution_id = %(id)s

-- name: lock_execution
-- Executions rows are written after start only by a priority change: the lock
-- serializes cancellers, priority changes and signal senders to one run.
SELECT tenant, shardq.run_state(id) AS state, concurrency_key FROM shardq.executions
WHERE id = %(id)s
FOR UPDATE

-- name: admission_lock
-- The shard's concurrency admission lock (schema/functions/admit_task.sql),
-- until the transaction ends: taken by a canceller or a priority change of a
-- limited run after its run's locks, so a promotion of the run (which holds it)
-- has committed before, and is seen, or starts after, and sees the change.
SELECT pg_advisory_xact_lock(shardq.admission_lock_key())

-- name: set_priority
-- A live run's new priority, on both rows, which the caller has locked (task row
-- first): the run's, which every later wake copies into the task row it inserts,
-- and the task row it has now, if any. The only update of an executions row: an
-- operator's action, rare, so the row's fillfactor 100 (insert-only) stays right.
WITH task AS (
    UPDATE shardq.tasks SET priority = %(priority)s WHERE execution_id = %(id)s
), queued AS (
    -- A run waiting for a slot of its concurrency key is promoted by priority too.
    UPDATE shardq.key_queue SET priority = %(priority)s WHERE execution_id = %(id)s
)
UPDATE shardq.executions SET priority = %(priority)s WHERE id = %(id)s

-- name: deliver_signals
-- One tenant's signals to runs on this shard, in one transaction; a row per
-- signal in input order. Body: schema/functions/deliver_signals.sql. The
-- payloads travel as one JSON array, not as a jsonb[] parameter: the driver
-- writes an array's text form in Python, escaping every quote of every
-- document by a regex callback (a profile of the relay delivering 500 children's
-- start documents a round found it beside the target's statement).
SELECT ord, signal_id, earlier_id, earlier_name, reason_code, detail
FROM shardq.deliver_signals(
    %(tenant)s, %(ids)b::uuid[], %(names)s::text[],
    ARRAY(SELECT v FROM jsonb_array_elements(%(payloads)s::jsonb)
          WITH ORDINALITY AS t(v, i) ORDER BY i),
    %(keys)s::text[],
    %(max_pending)s, %(max_pending_total)s, %(origins)s::text[], %(traces)s::text[]
)
ORDER BY ord

-- name: signal_with_start
-- Start the run of a workflow key unless it exists, and signal it, in one
-- transaction. Body: schema/functions/signal_with_start_v2.sql.
SELECT execution_id, created, signal_id, earlier_id, earlier_name, reason_code, detail
FROM shardq.signal_with_start_v2(
    %(tenant)s, %(workflow_name)s, %(workflow_version)s, %(workflow_id)s, %(new_id)s,
    %(input)s::jsonb, %(name)s, %(payload)s::jsonb, %(key)s, %(max_pending)s,
    %(max_pending_total)s, %(gates)s::text[], %(priority)s::smallint, %(concurrency_key)s,
    %(concurrency_limit)s::int
)

-- name: open_wait
-- The open wait of each of these runs that has one.
SELECT execution_id, kind, name, started_at, deadline, request FROM shardq.waits
WHERE execution_id = ANY(%(ids)b::uuid[]) AND (SELECT shardq.owns(%(ids)b::uuid[]))

-- name: pending_signals
-- Signals buffered for these runs, oldest first (at most the pending bound each).
SELECT execution_id, id, name, payload, idempotency_key, received_at FROM shardq.signals
WHERE execution_id = ANY(%(ids)b::uuid[]) AND consumed_at IS NULL
  AND (SELECT shardq.owns(%(ids)b::uuid[]))
ORDER BY id

-- name: children_of
-- The children a run started, in start order (schema/0023).
SELECT child_id, workflow_name AS workflow, workflow_id, position, policy, ended
FROM shardq.children WHERE parent_id = %(id)s AND (SELECT shardq.owns(ARRAY[%(id)s::uuid]))
ORDER BY position

-- name: count_runs
-- Runs by workflow and kind, of one tenant (or every tenant: NULL) and one workflow
-- (or every one). The counters (schema/0029: the folded rows and the changes not
-- folded yet, exact in this snapshot) hold 'started', each ended state, and the
-- runs each kind of open wait holds; a run a worker holds (a live lease) is
-- running, whatever its wait (shardq.run_state), so the leased runs are counted
-- here and taken off their wait's count. Pending is what is left (store/counts.py):
-- started, less every other state. Costs the counters' rows and the task rows,
-- never the shard's history nor its waits.
WITH wanted AS (
    SELECT %(tenant)s::text AS tenant, %(workflow)s::text AS workflow
), counted AS (
    -- A tenant's counters by their key's leading column; every tenant's only when
    -- asked for (a one-time filter): with many tenants, an `IS NULL OR` read them all.
    SELECT c.workflow_name, c.kind, c.n FROM shardq.run_counts c, wanted w
    WHERE c.tenant = w.tenant AND (w.workflow IS NULL OR c.workflow_name = w.workflow)
    UNION ALL
    SELECT c.workflow_name, c.kind, c.n FROM shardq.run_counts c
    WHERE %(tenant)s::text IS NULL
      AND (%(workflow)s::text IS NULL OR c.workflow_name = %(workflow)s::text)
    UNION ALL
    SELECT c.workflow_name, c.kind, c.n FROM shardq.run_count_changes c, wanted w
    WHERE c.tenant = w.tenant AND (w.workflow IS NULL OR c.workflow_name = w.workflow)
    UNION ALL
    SELECT c.workflow_name, c.kind, c.n FROM shardq.run_count_changes c
    WHERE %(tenant)s::text IS NULL
      AND (%(workflow)s::text IS NULL OR c.workflow_name = %(workflow)s::text)
), leased AS (
    SELECT x.workflow_name,
           (SELECT shardq.wait_state(p.kind) FROM shardq.waits p
            WHERE p.execution_id = t.execution_id) AS parked
    FROM shardq.tasks t, wanted w,
         -- A probe a task (OFFSET 0 keeps it one): a hash join would read every run.
         LATERAL (SELECT r.workflow_name FROM shardq.executions r
                  WHERE r.id = t.execution_id OFFSET 0) x
    WHERE t.leased_until > now() AND (w.tenant IS NULL OR t.tenant = w.tenant)
      AND (w.workflow IS NULL OR x.workflow_name = w.workflow)
)
SELECT workflow_name AS workflow, kind, sum(n)::bigint AS n
FROM (SELECT workflow_name, kind, n FROM counted
      UNION ALL
      SELECT workflow_name, 'running', 1 FROM leased
      UNION ALL
      SELECT workflow_name, parked, -1 FROM leased WHERE parked IS NOT NULL) c
GROUP BY 1, 2

-- name: fold_run_counts
-- A worker's fold of the appended count changes (schema/functions/fold_run_counts.sql).
SELECT shardq.fold_run_counts() AS folded

-- name: cancel_now
-- Cancel a run no worker holds, its rows locked: body, schema/functions/cancel_run.sql
-- (its task, wait and slot, an open interrupt decided `cancel` by the caller's
-- actor, its parent told, its children asked to cancel).
SELECT shardq.cancel_run(%(id)s, %(actor)s::text) AS cancelled

-- name: request_cancel
-- A worker holds the run: it ends cancelled at that worker's next commit
-- that is not a mid-turn checkpoint (a checkpoint makes it stop at its next
-- workflow call).
UPDATE shardq.tasks SET cancel_requested = true WHERE execution_id = %(id)s

-- name: takes_writes
-- Whether a write would be accepted: not a standby, not switched read-only.
SELECT current_setting('transaction_read_only') = 'off' AS writable

-- name: open_interrupt
-- The run's tenant and, when it waits for interrupt `name`, that wait: what a
-- decision is checked against before it is sent.
SELECT x.tenant, w.position, w.request
FROM shardq.executions x
LEFT JOIN shardq.waits w ON w.execution_id = x.id AND w.kind = 'interrupt' AND w.name = %(name)s
WHERE x.id = %(id)s AND (SELECT shardq.owns(ARRAY[%(id)s::uuid]))

-- name: decide_interrupt
-- Body: schema/functions/decide_interrupt.sql.
SELECT outcome, decision, detail
FROM shardq.decide_interrupt(%(tenant)s, %(id)s, %(name)s, %(position)s, %(action)s,
                             %(payload)s::jsonb, %(decision_id)s, %(actor)s)

-- name: pending_interrupts
-- A page of a shard's open interrupts, oldest first, after the keyset
-- position (started_at, execution_id); the tenant, workflow and age filters
-- apply to the run (waits_interrupts index). `waited_s`: only those open at
-- least that long.
SELECT w.execution_id, x.tenant, x.workflow_name, x.workflow_id, w.name,
       w.request->>'prompt' AS prompt, w.request->'actions' AS actions,
       w.request->'schema' AS schema, w.started_at AS requested_at, w.deadline,
       w.request->'value' AS value
FROM shardq.waits w
JOIN shardq.executions x ON x.id = w.execution_id
WHERE w.kind = 'interrupt'
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(w.execution_id)) = 1)
  AND (w.started_at, w.execution_id) > (%(after_at)s, %(after_id)s)
  AND x.tenant = %(tenant)s
  AND (%(workflow)s::text IS NULL OR x.workflow_name = %(workflow)s)
  AND w.started_at <= now() - make_interval(secs => %(waited_s)s)
ORDER BY w.started_at, w.execution_id
LIMIT %(limit)s

-- name: pending_interrupts_newest
-- The same, newest first, before the keyset position.
SELECT w.execution_id, x.tenant, x.workflow_name, x.workflow_id, w.name,
       w.request->>'prompt' AS prompt, w.request->'actions' AS actions,
       w.request->'schema' AS schema, w.started_at AS requested_at, w.deadline,
       w.request->'value' AS value
FROM shardq.waits w
JOIN shardq.executions x ON x.id = w.execution_id
WHERE w.kind = 'interrupt'
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(w.execution_id)) = 1)
  AND (w.started_at, w.execution_id) < (%(after_at)s, %(after_id)s)
  AND x.tenant = %(tenant)s
  AND (%(workflow)s::text IS NULL OR x.workflow_name = %(workflow)s)
  AND w.started_at <= now() - make_interval(secs => %(waited_s)s)
ORDER BY w.started_at DESC, w.execution_id DESC
LIMIT %(limit)s

-- name: stale_waits
-- Stale waits with their runs, oldest first (body: schema/functions/stale_waits.sql).
SELECT s.execution_id, x.tenant, x.workflow_name, s.kind, s.name,
       extract(epoch FROM now() - s.started_at)::float8 AS age_s, s.deadline
FROM shardq.stale_waits(%(timer_s)s, %(signal_s)s, %(condition_s)s, %(interrupt_s)s,
                        %(grace_s)s) s
JOIN shardq.executions x ON x.id = s.execution_id
WHERE (%(kind)s::text IS NULL OR s.kind = %(kind)s)
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(s.execution_id)) = 1)
  AND (%(workflow)s::text IS NULL OR x.workflow_name = %(workflow)s)
  AND (%(tenant)s::text IS NULL OR x.tenant = %(tenant)s)
ORDER BY s.started_at
LIMIT %(limit)s

-- name: stale_wait_counts
-- Stale waits by kind and workflow, with the oldest one's age (the exporter).
SELECT s.kind, x.workflow_name, count(*) AS n,
       extract(epoch FROM now() - min(s.started_at))::float8 AS oldest_s
FROM shardq.stale_waits(%(timer_s)s, %(signal_s)s, %(condition_s)s, %(interrupt_s)s,
                        %(grace_s)s) s
JOIN shardq.executions x ON x.id = s.execution_id
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(s.execution_id)) = 1)
GROUP BY 1, 2

-- name: local_statement_timeout
-- Bounds every statement of the current transaction (a scrape must not hang).
SELECT set_config('statement_timeout', %(ms)s, true)

-- name: open_waits_by_workflow
-- Open waits by kind and workflow. An aggregate over every open wait (a join
-- to the run's row for its workflow): ~0.3 s per million parked runs on a
-- small VM, which is why the exporter caches its answers.
SELECT w.kind, x.workflow_name, count(*) AS n
FROM shardq.waits w JOIN shardq.executions x ON x.id = w.execution_id
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(w.execution_id)) = 1)
GROUP BY 1, 2

-- name: pending_signal_count
-- Signals buffered and not yet consumed (signals_pending, index only).
SELECT count(*) AS n FROM shardq.signals s WHERE consumed_at IS NULL
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(s.execution_id)) = 1)

-- name: overdue_tasks
-- Tasks due more than `grace` seconds ago and not running: nobody claims them
-- (missing workers, or none of the build their runs are pinned to), or their
-- lease expired and nobody took it over (shardq.tasks_before; a leased task is
-- due again from its lease's expiry).
SELECT count(*) AS n,
       extract(epoch FROM now() - min(greatest(run_at, leased_until)))::float8 AS oldest_s
FROM shardq.tasks_before(now() - make_interval(secs => %(grace_s)s)) t
WHERE (leased_until IS NULL OR leased_until < now() - make_interval(secs => %(grace_s)s))
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(t.execution_id)) = 1)

-- name: due_by_priority
-- Tasks due now and not running, by priority level: the backlog each level
-- waits behind (docs/flow-control.md), pinned runs included (shardq.tasks_before).
SELECT priority, count(*) AS n
FROM shardq.tasks_before(now() + interval '1 microsecond') t
WHERE (leased_until IS NULL OR leased_until <= now())
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(t.execution_id)) = 1)
GROUP BY priority

-- name: runs_by_state
-- The exporter's reads count the runs of `mine` only, the buckets the reader's
-- map gives this shard: a run being moved is counted once (holds_exactly.sql).
-- Runs by state, counted where each state lives, as shardq.run_state() reads
-- one run: finished by their outcome event (history_outcome, index only),
-- running by a live lease, waiting and input_required by an open wait whose
-- run holds no live lease, pending by a task with neither or a place in a
-- concurrency key's queue without a wait.
SELECT substr(kind, 5) AS state, count(*) AS n FROM shardq.history h
WHERE kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(h.execution_id)) = 1)
GROUP BY kind
UNION ALL
SELECT 'running', count(*) FROM shardq.tasks t
WHERE leased_until > now()
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(t.execution_id)) = 1)
UNION ALL
SELECT CASE w.kind WHEN 'interrupt' THEN 'input_required' ELSE 'waiting' END, count(*)
FROM shardq.waits w
WHERE NOT EXISTS (SELECT 1 FROM shardq.tasks t WHERE t.execution_id = w.execution_id
                  AND t.leased_until > now())
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(w.execution_id)) = 1)
GROUP BY 1
UNION ALL
SELECT 'pending', count(*) + (
    -- Runs waiting for a slot of their concurrency key: pending too.
    SELECT count(*) FROM shardq.key_queue q
    WHERE NOT EXISTS (SELECT 1 FROM shardq.waits w WHERE w.execution_id = q.execution_id)
      AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
           OR get_bit(%(mine)s::bit(4096), shardq.bucket(q.execution_id)) = 1))
FROM shardq.tasks t
WHERE (t.leased_until IS NULL OR t.leased_until <= now())
  AND NOT EXISTS (SELECT 1 FROM shardq.waits w WHERE w.execution_id = t.execution_id)
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(t.execution_id)) = 1)

-- name: purge_lock
-- One purger per shard at a time (a worker's housekeeping, `shardq purge`):
-- held until the batch's transaction ends.
SELECT pg_try_advisory_xact_lock(hashtext('shardq.purge')) AS held

-- name: purge_batch
-- Delete a batch of finished runs past retention with everything they left:
-- history, its row among the ended runs, its search attributes, signals, waits and
-- tasks (a finished run has none), the list of its children, and its settled outbox
-- rows. Runs another purger holds are skipped; each batch is its own short transaction.
WITH doomed AS (
    SELECT x.id, x.tenant FROM shardq.executions x
    WHERE x.id IN (SELECT p.execution_id FROM shardq.purgeable_runs(
        %(retention_s)s, %(workflows)s::text[], %(listed)s, %(limit)s) p)
    FOR UPDATE OF x SKIP LOCKED
), history AS (
    DELETE FROM shardq.history h WHERE h.execution_id IN (SELECT id FROM doomed)
), ended AS (
    DELETE FROM shardq.ended_runs e USING doomed d
    WHERE e.tenant = d.tenant AND e.execution_id = d.id
      AND e.state IN ('completed', 'failed', 'cancelled', 'timed_out')
), attributes AS (
    DELETE FROM shardq.run_attributes a WHERE a.execution_id IN (SELECT id FROM doomed)
), signals AS (
    DELETE FROM shardq.signals s WHERE s.execution_id IN (SELECT id FROM doomed)
), waits AS (
    DELETE FROM shardq.waits w WHERE w.execution_id IN (SELECT id FROM doomed)
), tasks AS (
    DELETE FROM shardq.tasks t WHERE t.execution_id IN (SELECT id FROM doomed)
), children AS (
    DELETE FROM shardq.children c WHERE c.parent_id IN (SELECT id FROM doomed)
), outbox AS (
    DELETE FROM shardq.outbox b
    WHERE b.source_execution_id IN (SELECT id FROM doomed) AND b.state <> 'pending'
)
DELETE FROM shardq.executions x WHERE x.id IN (SELECT id FROM doomed)
RETURNING x.id

-- name: purge_idle_keys
-- Delete a batch of concurrency keys idle for `idle_s`: no slot held, no run
-- waiting, no operator limit, not declared by a start since. Their rows would
-- otherwise pile up, one per key ever used (a key per customer). A run of the
-- key woken later brings its row back (admit_task.sql, from the run's limit);
-- a start declares it anew. Under the admission lock: no admission is half
-- way through a key deleted here.
WITH locked AS (
    SELECT pg_advisory_xact_lock(shardq.admission_lock_key())
)
DELETE FROM shardq.concurrency_keys k
WHERE k.key IN (
    SELECT i.key FROM shardq.concurrency_keys i, locked
    WHERE i.updated_at < now() - make_interval(secs => %(idle_s)s)
      AND i.held = 0 AND i.override IS NULL
      AND NOT EXISTS (SELECT 1 FROM shardq.key_queue q WHERE q.concurrency_key = i.key)
    ORDER BY i.updated_at
    LIMIT %(limit)s)
RETURNING k.key

-- name: purge_count
-- How many runs a purge would delete now (`shardq purge --dry-run`).
SELECT count(*) AS n
FROM shardq.purgeable_runs(%(retention_s)s, %(workflows)s::text[], %(listed)s, NULL)

-- name: update_outcome
-- An update's recorded outcome (its update.completed event, found by the
-- update's signal id among the run's events) and the run's state.
SELECT (SELECT h.payload FROM shardq.history h
        WHERE h.execution_id = %(id)s AND h.kind = 'update.completed'
          AND h.payload->'signal_id' = to_jsonb(%(update_id)s::bigint)
        LIMIT 1) AS outcome,
       shardq.run_state(%(id)s) AS state
WHERE (SELECT shardq.owns(ARRAY[%(id)s::uuid]))

-- name: signal_by_key
-- The signal an idempotency key landed as, if it did (any name: keys are per run).
SELECT id, name FROM shardq.signals
WHERE execution_id = %(id)s AND idempotency_key = %(key)s
  AND (SELECT shardq.owns(ARRAY[%(id)s::uuid]))

-- name: workflows_of
-- The workflow (name, version) of each run: what a signal's schema is looked up by.
SELECT id, workflow_name, workflow_version FROM shardq.executions
WHERE id = ANY(%(ids)b::uuid[]) AND (SELECT shardq.owns(%(ids)b::uuid[]))

-- == Schedules (schema/0024; the home shard's rows) ==

-- name: db_now
SELECT now() AS now

-- name: create_schedule
-- A new schedule; an existing name inserts nothing (the caller says so).
INSERT INTO shardq.schedules (name, tenant, workflow_name, input, cron, every_s, timezone,
                              overlap, catchup_s, next_at)
VALUES (%(name)s, %(tenant)s, %(workflow)s, %(input)s::jsonb, %(cron)s, %(every_s)s,
        %(timezone)s, %(overlap)s, %(catchup_s)s, %(next_at)s)
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: schedules
-- Schedules of a tenant (every tenant's when it is NULL), by name, after a name.
SELECT name, tenant, workflow_name AS workflow, input, cron, every_s, timezone, overlap,
       catchup_s, paused, next_at, last_tick, last_run, buffered_at, triggered_at, started,
       skipped, missed, created_at
FROM shardq.schedules
WHERE (%(tenant)s::text IS NULL OR tenant = %(tenant)s) AND (%(name)s::text IS NULL
       OR name = %(name)s) AND name > %(after)s
ORDER BY name
LIMIT %(limit)s

-- name: pause_schedule
UPDATE shardq.schedules SET paused = true, updated_at = now()
WHERE name = %(name)s AND tenant = %(tenant)s
RETURNING name

-- name: resume_schedule
-- Ticks that passed while paused are not run: the next one is after now.
UPDATE shardq.schedules SET paused = false, next_at = %(next_at)s, updated_at = now()
WHERE name = %(name)s AND tenant = %(tenant)s
RETURNING name

-- name: trigger_schedule
-- A run now, whatever the overlap policy, started by the next ticker round.
UPDATE shardq.schedules SET triggered_at = now(), updated_at = now()
WHERE name = %(name)s AND tenant = %(tenant)s
RETURNING name, triggered_at

-- name: delete_schedule
-- Its runs go on; no tick starts another.
DELETE FROM shardq.schedules WHERE name = %(name)s AND tenant = %(tenant)s RETURNING name

-- name: claim_schedules
-- A ticker's round: the due schedules and those holding a buffered tick or a
-- trigger, locked until the round's commit (SKIP LOCKED: another ticker takes
-- others), with this shard's clock.
WITH due AS (
    SELECT s.name FROM shardq.schedules s
    WHERE NOT s.paused AND s.next_at <= now()
    ORDER BY s.next_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), held AS (
    SELECT s.name FROM shardq.schedules s
    WHERE (s.buffered_at IS NOT NULL OR s.triggered_at IS NOT NULL)
      AND (s.triggered_at IS NOT NULL OR NOT s.paused)
      AND s.name NOT IN (SELECT d.name FROM due d)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
-- Columns in core/schedules.DueSchedule's order (read positionally); the input as
-- text, as the tick's runs take it.
SELECT s.name, s.tenant, s.workflow_name, s.input::text, s.cron, s.every_s, s.timezone,
       s.overlap, s.catchup_s, s.paused, s.next_at, s.last_run, s.buffered_at,
       s.triggered_at, now()
FROM shardq.schedules s
WHERE s.name IN (SELECT d.name FROM due d UNION ALL SELECT h.name FROM held h)

-- name: next_schedule_in
-- Seconds until the next due tick (NULL: none), what a ticker sleeps at most.
SELECT extract(epoch FROM min(next_at) - now())::float8 AS seconds
FROM shardq.schedules WHERE NOT paused

-- name: advance_schedules
-- The claimed schedules moved on by their round, in one statement: what plan() decided.
UPDATE shardq.schedules s
SET next_at = u.next_at, buffered_at = u.buffered_at, triggered_at = NULL,
    last_tick = coalesce(u.last_tick, s.last_tick), last_run = coalesce(u.last_run, s.last_run),
    started = s.started + u.started, skipped = s.skipped + u.skipped,
    missed = s.missed + u.missed, updated_at = now()
FROM unnest(%(names)b::text[], %(next_at)b::timestamptz[], %(buffered_at)b::timestamptz[],
            %(last_tick)b::timestamptz[], %(last_run)b::uuid[], %(started)b::integer[],
            %(skipped)b::integer[], %(missed)b::integer[])
     AS u(name, next_at, buffered_at, last_tick, last_run, started, skipped, missed)
WHERE s.name = u.name

-- name: run_states
-- The state of each of these runs of this shard.
SELECT id, shardq.run_state(id) AS state FROM shardq.executions
WHERE id = ANY(%(ids)b::uuid[]) AND (SELECT shardq.owns(%(ids)b::uuid[]))

-- == Builds (schema/0026; docs/versioning.md, "Builds") ==

-- name: workflow_builds
-- Workflows' current builds on this shard (every shard holds the same rows).
SELECT workflow_name, build_id, pinned FROM shardq.workflow_builds ORDER BY workflow_name

-- name: set_workflow_build
-- An operator's current build for a workflow, or none (NULL: the row goes, and
-- new runs record no build and are pinned to none).
WITH gone AS (
    DELETE FROM shardq.workflow_builds
    WHERE workflow_name = %(workflow)s AND %(build)s::text IS NULL
)
INSERT INTO shardq.workflow_builds AS b (workflow_name, build_id, pinned)
SELECT %(workflow)s, %(build)s::text, %(pinned)s WHERE %(build)s::text IS NOT NULL
ON CONFLICT (workflow_name) DO UPDATE
SET build_id = excluded.build_id, pinned = excluded.pinned, updated_at = now()

-- name: pinned_runs
-- Runs pinned to a build and not finished, by workflow and build, of the buckets
-- `mine` (executions_pinned, with a probe of history_outcome per pinned run:
-- an operator's read, which costs the pinned runs the shard keeps), of `workflow`
-- only unless NULL (then a range of the index).
SELECT e.workflow_name, e.build_id, count(*) AS n
FROM shardq.executions e
WHERE e.pinned AND (%(workflow)s::text IS NULL OR e.workflow_name = %(workflow)s::text)
  AND NOT EXISTS (
      SELECT 1 FROM shardq.history o
      WHERE o.execution_id = e.id
        AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out'))
  AND ((SELECT shardq.holds_exactly(%(mine)s::bit(4096)))
       OR get_bit(%(mine)s::bit(4096), shardq.bucket(e.id)) = 1)
GROUP BY 1, 2 ORDER BY 1, 2

-- name: migrate_pinned_runs
-- migrate-build's first step: the unfinished runs of `workflow` pinned to
-- `from_build` move to `to_build` (NULL: pinned to none), and their task rows
-- with them. A statement that read a run's old build before this commits may
-- still write a task row with it: migrate_pinned_tasks, run once those
-- transactions are over, moves those rows too.
WITH moved AS (
    UPDATE shardq.executions e
    SET build_id = coalesce(%(to_build)s::text, e.build_id),
        pinned = %(to_build)s::text IS NOT NULL
    WHERE e.workflow_name = %(workflow)s AND e.pinned AND e.build_id = %(from_build)s
      AND NOT EXISTS (
          SELECT 1 FROM shardq.history o
          WHERE o.execution_id = e.id
            AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out'))
    RETURNING e.id
), tasks AS (
    UPDATE shardq.tasks t SET build_id = %(to_build)s::text
    FROM moved m WHERE t.execution_id = m.id
)
SELECT count(*) AS n FROM moved

-- name: migrate_pinned_tasks
-- migrate-build's second step: task rows still pinned to `from_build` whose run
-- the first step moved (a range of tasks_pinned, then a key probe each).
UPDATE shardq.tasks t SET build_id = CASE WHEN e.pinned THEN e.build_id END
FROM shardq.executions e
WHERE t.build_id = %(from_build)s AND e.id = t.execution_id
  AND e.workflow_name = %(workflow)s AND NOT (e.pinned AND e.build_id = %(from_build)s)
RETURNING t.execution_id

-- name: older_transactions
-- Transactions on this database still open that began before `since` (NULL: this
-- statement's own clock, which it answers): migrate-build waits for them between its
-- two steps. Sessions of other roles show no xact_start without pg_read_all_stats.
SELECT s.since, (SELECT count(*) FROM pg_stat_activity a
                 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                   AND a.xact_start < s.since) AS n
FROM (SELECT coalesce(%(since)s::timestamptz, clock_timestamp()) AS since) s
