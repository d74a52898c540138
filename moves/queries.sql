-- The move store's statements (moves/store.py), for the mover and `shards status`.
-- Three kinds of shard take part: home (the journal and the mover's lock), the
-- source A and the target B of a move; the other shards only receive new map
-- versions. What a map change does too (the mover's lock, writing and reading a
-- map version, the schema version) is in shards/queries.sql, once.
-- Bit strings are bit(4096), bucket 0 first (get_bit counts from the left).

-- == the map and ownership, on any shard ==

-- name: newest_map
SELECT version, layout::text AS layout FROM shardq.shard_maps ORDER BY version DESC LIMIT 1

-- name: notify_map
-- A hint for processes that follow the map; the version itself is in shard_maps.
-- On the target, the switch also wakes its workers and relays: the batch's due
-- tasks (timers that came due while it was frozen, leases the copy released)
-- and pending outbox rows arrived by COPY, which notifies no one, and a claim
-- loop would otherwise sleep until the next due time it knew of.
SELECT pg_notify('shardq_map', %(version)s::text), pg_notify(shardq.wake_channel(), ''),
       pg_notify(shardq.outbox_channel(), '')

-- name: ownership_bits
SELECT deployment, map_version, writable::text AS writable, owned::text AS owned, unclean,
       fence_move, fence_target
FROM shardq.ownership

-- name: set_application_name
-- Names the mover's sessions in pg_stat_activity (a re-run finds an orphaned switch by it).
SELECT set_config('application_name', %(name)s, false)

-- == the mover's lock and journal, on home ==

-- name: mover_lock_holder
-- A bigint advisory key shows in pg_locks as its high and low 32 bits.
SELECT a.pid, a.application_name, coalesce(host(a.client_addr), 'local') AS host,
       a.backend_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
        SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = %(high)s::oid AND l.objid = %(low)s::oid AND l.objsubid = 1
LIMIT 1

-- name: unfinished_move
SELECT id, first_bucket, last_bucket, source, target, phase, from_version, max_batch_runs,
       max_batch_rows, grace_s, started_at
FROM shardq.moves WHERE phase IN ('moving', 'cleaning')

-- name: move_by_id
SELECT id, first_bucket, last_bucket, source, target, phase, from_version, max_batch_runs,
       max_batch_rows, grace_s, started_at
FROM shardq.moves WHERE id = %(id)s

-- name: insert_move
INSERT INTO shardq.moves (first_bucket, last_bucket, source, target, phase, from_version,
                          max_batch_runs, max_batch_rows, grace_s)
VALUES (%(first)s, %(last)s, %(source)s, %(target)s, 'moving', %(from_version)s,
        %(max_runs)s, %(max_rows)s, %(grace_s)s)
RETURNING id

-- name: insert_batch
INSERT INTO shardq.move_batches (move_id, batch, first_bucket, last_bucket, phase,
                                 planned_runs, planned_rows)
VALUES (%(move)s, %(batch)s, %(first)s, %(last)s, 'planned', %(runs)s, %(rows)s)

-- name: drop_planned_batches
-- A slow batch's successors, re-planned smaller: never frozen (journaled `planned`),
-- so no target holds a switch under their numbers.
DELETE FROM shardq.move_batches
WHERE move_id = %(move)s AND batch > %(after)s AND phase = 'planned'

-- name: set_batch_limits
UPDATE shardq.moves SET max_batch_runs = %(runs)s, max_batch_rows = %(rows)s, updated_at = now()
WHERE id = %(move)s

-- name: move_batches
SELECT batch, first_bucket, last_bucket, phase, planned_runs, planned_rows, runs, rows_copied,
       paused_ms, map_version, released_at
FROM shardq.move_batches WHERE move_id = %(move)s ORDER BY batch

-- name: pending_cleanups
-- Switched batches whose source still keeps its copy, of every move, soonest due
-- first: a copy is deleted once its move's grace period after the release is over.
-- due_in_s is read once by the mover and kept as a deadline (home's clock decides).
SELECT b.move_id, b.batch, b.first_bucket, b.last_bucket, m.source,
       b.released_at + make_interval(secs => m.grace_s) AS due_at,
       greatest(0, extract(epoch FROM b.released_at + make_interval(secs => m.grace_s)
                                       - now()))::float8 AS due_in_s
FROM shardq.move_batches b JOIN shardq.moves m ON m.id = b.move_id
WHERE b.phase = 'released'
ORDER BY due_at, b.move_id, b.batch

-- name: latest_uncleaned_move
-- The newest finished move whose source still keeps copies: `--resume` finishes it.
SELECT m.id FROM shardq.moves m
WHERE EXISTS (SELECT 1 FROM shardq.move_batches b WHERE b.move_id = m.id AND b.phase = 'released')
ORDER BY m.id DESC LIMIT 1

-- name: set_batch_phase
UPDATE shardq.move_batches SET phase = %(phase)s WHERE move_id = %(move)s AND batch = %(batch)s

-- name: batch_switched
UPDATE shardq.move_batches
SET phase = 'switched', runs = %(runs)s, rows_copied = %(rows)s, paused_ms = %(paused_ms)s,
    map_version = %(version)s
WHERE move_id = %(move)s AND batch = %(batch)s

-- name: batch_switched_found
-- A re-run found the switch committed on the target; what it copied is not known.
UPDATE shardq.move_batches SET phase = 'switched', map_version = %(version)s
WHERE move_id = %(move)s AND batch = %(batch)s AND phase IN ('planned', 'fenced')

-- name: batch_released
UPDATE shardq.move_batches
SET phase = 'released', map_version = %(version)s, released_at = coalesce(released_at, now())
WHERE move_id = %(move)s AND batch = %(batch)s AND phase IN ('planned', 'fenced', 'switched')

-- name: set_move_phase
UPDATE shardq.moves
SET phase = %(phase)s, updated_at = now(),
    finished_at = CASE WHEN %(phase)s IN ('done', 'aborted') THEN now() END
WHERE id = %(move)s

-- == planning, on the source ==

-- name: bucket_counts
-- One scan of the range's runs (there is no index on the bucket: every start
-- would pay for it, and moves are rare). Rows: the run, its history (probed
-- by the history key) and about three more (task, wait, a signal or two).
SELECT shardq.bucket(e.id) AS bucket, count(*)::bigint AS runs,
       (count(*) * 4 + sum((SELECT count(*) FROM shardq.history h
                            WHERE h.execution_id = e.id)))::bigint AS rows
FROM shardq.executions e
WHERE shardq.bucket(e.id) BETWEEN %(first)s AND %(last)s
GROUP BY 1

-- name: runs_per_bucket
-- Rebalancing's picture of a shard: its runs per bucket, owned buckets only.
SELECT shardq.bucket(e.id) AS bucket, count(*)::bigint AS runs
FROM shardq.executions e, shardq.ownership o
WHERE get_bit(o.owned, shardq.bucket(e.id)) = 1
GROUP BY 1

-- == F1, F2: the freeze, on the source ==

-- name: freeze
-- Only where the source owns every bucket of the batch: a re-run that finds
-- it released does not freeze what it no longer has.
UPDATE shardq.ownership
SET writable = writable & ~%(bits)s::bit(4096), unclean = true,
    fence_move = %(move)s, fence_target = %(target)s
WHERE owned & %(bits)s::bit(4096) = %(bits)s::bit(4096)
RETURNING map_version

-- name: unfreeze
-- Writable again where still owned; the fence's names go when nothing is frozen.
UPDATE shardq.ownership
SET writable = writable | (owned & %(bits)s::bit(4096)),
    fence_move = CASE WHEN (writable | (owned & %(bits)s::bit(4096))) = owned THEN NULL
                      ELSE fence_move END,
    fence_target = CASE WHEN (writable | (owned & %(bits)s::bit(4096))) = owned THEN NULL
                        ELSE fence_target END

-- name: writers
-- Transactions of this database holding an xid now, other than ours.
SELECT pid, backend_xid::text AS xid
FROM pg_stat_activity
WHERE datname = current_database() AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()

-- name: writers_left
SELECT a.pid, a.application_name, extract(epoch FROM now() - a.xact_start)::float8 AS age_s
FROM pg_stat_activity a
JOIN unnest(%(pids)s::int[], %(xids)s::text[]) AS w(pid, xid)
  ON a.pid = w.pid AND a.backend_xid::text = w.xid

-- == S1: the copy, read on the source in one REPEATABLE READ READ ONLY snapshot ==

-- name: batch_runs
SELECT id FROM shardq.executions WHERE shardq.bucket(id) BETWEEN %(first)s AND %(last)s

-- name: batch_maxima
SELECT (SELECT max(seq) FROM shardq.history WHERE execution_id = ANY(%(ids)s::uuid[]))
           AS history_seq,
       (SELECT max(id) FROM shardq.signals WHERE execution_id = ANY(%(ids)s::uuid[]))
           AS signal_id

-- The column lists of each pair below must match (binary COPY carries no
-- names): tests/integration/test_move_basics.py checks them against the
-- tables, so a migration adding a column fails there first.

-- name: copy_out_executions
COPY (SELECT id, tenant, workflow_name, workflow_version, workflow_id, input, created_at, gates,
             priority, concurrency_key, concurrency_limit, parent_id, trace, build_id, pinned
      FROM shardq.executions WHERE id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_executions
COPY shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id, input,
                        created_at, gates, priority, concurrency_key, concurrency_limit,
                        parent_id, trace, build_id, pinned)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_children
-- A parent's list of its children lives with the parent (schema/0023).
COPY (SELECT parent_id, child_id, position, workflow_name, workflow_id, policy, ended
      FROM shardq.children WHERE parent_id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_children
COPY shardq.children (parent_id, child_id, position, workflow_name, workflow_id, policy, ended)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_ended_runs
-- Found through each run's tenant and the four ended states: the primary key
-- (schema/0028), which has no index led by the run's id.
COPY (SELECT e.tenant, e.state, e.execution_id, e.workflow_name
      FROM shardq.executions x JOIN shardq.ended_runs e
        ON e.tenant = x.tenant AND e.execution_id = x.id
       AND e.state IN ('completed', 'failed', 'cancelled', 'timed_out')
      WHERE x.id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_ended_runs
COPY shardq.ended_runs (tenant, state, execution_id, workflow_name) FROM STDIN (FORMAT BINARY)

-- name: copy_out_run_attributes
-- Search attributes (schema/0030): the generated columns are made again on the target.
COPY (SELECT execution_id, name, tenant, value FROM shardq.run_attributes
      WHERE execution_id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_run_attributes
COPY shardq.run_attributes (execution_id, name, tenant, value) FROM STDIN (FORMAT BINARY)

-- name: copy_out_history
COPY (SELECT execution_id, seq, position, kind, name, payload, recorded_at
      FROM shardq.history WHERE execution_id = ANY(%(ids)s::uuid[])
      ORDER BY execution_id, seq) TO STDOUT (FORMAT BINARY)

-- name: copy_in_history
-- COPY writes an identity column from its input: the events keep their seq.
COPY shardq.history (execution_id, seq, position, kind, name, payload, recorded_at)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_signals
COPY (SELECT id, execution_id, tenant, name, payload, idempotency_key, received_at, consumed_at,
             consumed_position, origin, trace
      FROM shardq.signals WHERE execution_id = ANY(%(ids)s::uuid[])
      ORDER BY execution_id, id) TO STDOUT (FORMAT BINARY)

-- name: copy_in_signals
COPY shardq.signals (id, execution_id, tenant, name, payload, idempotency_key, received_at,
                     consumed_at, consumed_position, origin, trace) FROM STDIN (FORMAT BINARY)

-- name: copy_out_waits
-- Deadlines are absolute times: a timer wakes on the same second on the target.
COPY (SELECT execution_id, position, kind, name, started_at, deadline, request
      FROM shardq.waits WHERE execution_id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_waits
COPY shardq.waits (execution_id, position, kind, name, started_at, deadline, request)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_tasks
-- Leases are released on the copy: a turn in flight on the source is refused
-- at its commit there (the bucket is frozen) and runs again on the target, as
-- after a lost lease. A leased task is due now (a heartbeat may have moved its
-- run_at to the lease's expiry).
-- Except a keyed run's (schema/0020): its task row is its slot, and its lease
-- is copied as it is, so the target runs it again only when the lease has
-- passed (the source's heartbeats stop at the freeze). Its turn may still be
-- running on the source until then: released at once, the target would run
-- the key's runs beside it, past the key's limit. The session sets
-- shardq.slots_counted, so the copy is not admitted again.
COPY (SELECT execution_id,
             CASE WHEN lease_token IS NOT NULL AND concurrency_key IS NULL
                  THEN least(run_at, now()) ELSE run_at END,
             claims,
             CASE WHEN concurrency_key IS NOT NULL THEN lease_owner END,
             CASE WHEN concurrency_key IS NOT NULL THEN lease_token END,
             cancel_requested,
             CASE WHEN concurrency_key IS NOT NULL THEN leased_until END,
             priority, concurrency_key, tenant, build_id
      FROM shardq.tasks WHERE execution_id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_tasks
COPY shardq.tasks (execution_id, run_at, claims, lease_owner, lease_token, cancel_requested,
                   leased_until, priority, concurrency_key, tenant, build_id)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_concurrency_keys
-- A key lives in its bucket (schema/0020): its limit row goes with the bucket
-- range, whether or not the key has runs now, so an operator's limit moves too.
COPY (SELECT key, bucket, declared, override, held, updated_at
      FROM shardq.concurrency_keys WHERE bucket BETWEEN %(first)s AND %(last)s)
TO STDOUT (FORMAT BINARY)

-- name: copy_in_concurrency_keys
COPY shardq.concurrency_keys (key, bucket, declared, override, held, updated_at)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_key_queue
COPY (SELECT execution_id, concurrency_key, priority, claims, queued_at
      FROM shardq.key_queue WHERE execution_id = ANY(%(ids)s::uuid[])) TO STDOUT (FORMAT BINARY)

-- name: copy_in_key_queue
COPY shardq.key_queue (execution_id, concurrency_key, priority, claims, queued_at)
FROM STDIN (FORMAT BINARY)

-- name: copy_out_outbox
-- Rows sent by the batch's runs, in their order: the target numbers them anew
-- from its own identity, after every row it has, so each sender's order holds.
COPY (SELECT source_execution_id, source_position, target_execution_id, tenant, signal_name,
             payload, idempotency_key, state, attempts, next_attempt_at, failure_reason,
             failure_detail, created_at, finished_at, target_bucket, queued_at, trace
      FROM shardq.outbox WHERE source_execution_id = ANY(%(ids)s::uuid[])
      ORDER BY id) TO STDOUT (FORMAT BINARY)

-- name: copy_in_outbox
COPY shardq.outbox (source_execution_id, source_position, target_execution_id, tenant,
                    signal_name, payload, idempotency_key, state, attempts, next_attempt_at,
                    failure_reason, failure_detail, created_at, finished_at, target_bucket,
                    queued_at, trace) FROM STDIN (FORMAT BINARY)

-- == S1: the switch, one transaction on the target ==

-- name: switch_lock
-- Held until the switch commits or aborts: a re-run after a kill waits here
-- for an orphaned switch to end before it asks whether it committed.
SELECT pg_advisory_xact_lock(%(move)s::int4, %(batch)s::int4)

-- name: try_switch_lock
SELECT pg_try_advisory_xact_lock(%(move)s::int4, %(batch)s::int4) AS taken

-- name: end_orphaned_switch
SELECT pg_terminate_backend(pid) AS ended
FROM pg_stat_activity
WHERE application_name = %(name)s AND pid <> pg_backend_pid()

-- name: applied_batch
SELECT map_version FROM shardq.applied_batches WHERE move_id = %(move)s AND batch = %(batch)s

-- name: leftover_runs
-- Rows of buckets this shard does not own (a move off it not cleaned yet):
-- stale by definition, found before a copy of the same runs comes back.
SELECT e.id
FROM shardq.executions e, shardq.ownership o
WHERE shardq.bucket(e.id) BETWEEN %(first)s AND %(last)s
  AND get_bit(o.owned, shardq.bucket(e.id)) = 0
LIMIT %(limit)s

-- name: delete_runs
-- Every row of these runs, in one statement (the tables have no foreign keys
-- between them): outbox rows they sent, tasks, places in a key's queue, waits,
-- signals, history, children lists, search attributes, ended-run rows (found through the runs' tenants,
-- read in the statement's snapshot), runs. A key's slots are not given back here: its
-- row and its queue leave with the bucket (delete_leftover_keys), the target has them.
WITH o AS (DELETE FROM shardq.outbox WHERE source_execution_id = ANY(%(ids)s::uuid[])),
     t AS (DELETE FROM shardq.tasks WHERE execution_id = ANY(%(ids)s::uuid[])),
     q AS (DELETE FROM shardq.key_queue WHERE execution_id = ANY(%(ids)s::uuid[])),
     c AS (DELETE FROM shardq.children WHERE parent_id = ANY(%(ids)s::uuid[])),
     w AS (DELETE FROM shardq.waits WHERE execution_id = ANY(%(ids)s::uuid[])),
     s AS (DELETE FROM shardq.signals WHERE execution_id = ANY(%(ids)s::uuid[])),
     h AS (DELETE FROM shardq.history WHERE execution_id = ANY(%(ids)s::uuid[])),
     a AS (DELETE FROM shardq.run_attributes WHERE execution_id = ANY(%(ids)s::uuid[])),
     e AS (DELETE FROM shardq.ended_runs e USING shardq.executions x
           WHERE x.id = ANY(%(ids)s::uuid[]) AND e.tenant = x.tenant AND e.execution_id = x.id
             AND e.state IN ('completed', 'failed', 'cancelled', 'timed_out'))
DELETE FROM shardq.executions WHERE id = ANY(%(ids)s::uuid[])

-- name: move_session
-- For the rest of the transaction, task rows are copied in as they are: the
-- admission trigger (schema/0020) does not admit them again.
SELECT set_config('shardq.slots_counted', 'on', true)

-- name: delete_leftover_keys
-- The limit rows of keys in buckets this shard does not own, once their runs are gone.
DELETE FROM shardq.concurrency_keys k USING shardq.ownership o
WHERE k.bucket BETWEEN %(first)s AND %(last)s AND get_bit(o.owned, k.bucket) = 0

-- name: advance_history_seq
-- Later events of the moved runs must sort after the copied ones. nextval,
-- not last_value, decides: it never goes back, whatever runs beside us.
SELECT setval(x.s, %(max)s)
FROM (SELECT pg_get_serial_sequence('shardq.history', 'seq')::regclass AS s) AS x
WHERE nextval(x.s) < %(max)s

-- name: advance_signal_id
-- A later signal to a moved run gets a larger id (replay consumes in id order).
SELECT setval(x.s, %(max)s)
FROM (SELECT pg_get_serial_sequence('shardq.signals', 'id')::regclass AS s) AS x
WHERE nextval(x.s) < %(max)s

-- name: take_ownership
UPDATE shardq.ownership
SET owned = owned | %(bits)s::bit(4096), writable = writable | %(bits)s::bit(4096),
    map_version = greatest(map_version, %(version)s)

-- name: record_applied
INSERT INTO shardq.applied_batches (move_id, batch, map_version)
VALUES (%(move)s, %(batch)s, %(version)s)

-- == R: the release, on the source ==

-- name: release
-- The fence's names go once nothing else is frozen here.
UPDATE shardq.ownership
SET owned = owned & ~%(bits)s::bit(4096), writable = writable & ~%(bits)s::bit(4096),
    map_version = greatest(map_version, %(version)s),
    fence_move = CASE WHEN writable & ~%(bits)s::bit(4096) = owned & ~%(bits)s::bit(4096)
                      THEN NULL ELSE fence_move END,
    fence_target = CASE WHEN writable & ~%(bits)s::bit(4096) = owned & ~%(bits)s::bit(4096)
                        THEN NULL ELSE fence_target END

-- name: table_rows
-- The rows each table's statistics describe (-1: never analyzed).
SELECT c.relname, c.reltuples
FROM pg_class c
WHERE c.relnamespace = rtrim('shardq.', '.')::regnamespace  -- the shard's schema
  AND c.relname = ANY(%(tables)s::text[])

-- name: analyze_lock_timeout
SET LOCAL lock_timeout = '1s'

-- One statement per table the move copies: ANALYZE takes no parameter for its table.
-- name: analyze_executions
ANALYZE shardq.executions

-- name: analyze_history
ANALYZE shardq.history

-- name: analyze_signals
ANALYZE shardq.signals

-- name: analyze_waits
ANALYZE shardq.waits

-- name: analyze_tasks
ANALYZE shardq.tasks

-- name: analyze_outbox
ANALYZE shardq.outbox

-- name: analyze_concurrency_keys
ANALYZE shardq.concurrency_keys

-- name: analyze_key_queue
ANALYZE shardq.key_queue

-- name: analyze_children
ANALYZE shardq.children

-- name: analyze_ended_runs
ANALYZE shardq.ended_runs

-- name: analyze_run_attributes
ANALYZE shardq.run_attributes

-- == C: cleanup, on the source ==

-- name: mark_clean
-- Clean again once nothing is frozen and no run of a bucket it does not own is
-- left, nor a concurrency key's row (a cleanup killed between a range's runs
-- and its keys: a move of the range back would find the key's row here).
UPDATE shardq.ownership o
SET unclean = false
WHERE o.unclean AND o.writable = o.owned
  AND NOT EXISTS (SELECT 1 FROM shardq.executions e
                  WHERE get_bit(o.owned, shardq.bucket(e.id)) = 0)
  AND NOT EXISTS (SELECT 1 FROM shardq.concurrency_keys k
                  WHERE get_bit(o.owned, k.bucket) = 0)
