-- The benchmark suite's own statements: provisioning, progress polls, the raw
-- SKIP LOCKED floor and the bulk insert of parked runs. The engine's statements
-- live in store/queries.sql; nothing here is used by shardq itself.
-- Loaded by benchmarks/db.py; one `-- name:` header per statement.

-- name: server_facts
SELECT current_setting('server_version') AS server_version,
       current_setting('fsync') AS fsync,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('full_page_writes') AS full_page_writes,
       current_setting('wal_level') AS wal_level,
       current_setting('shared_buffers') AS shared_buffers,
       current_setting('autovacuum') AS autovacuum,
       current_setting('max_connections') AS max_connections,
       current_setting('shared_preload_libraries') AS shared_preload_libraries

-- name: has_executions
SELECT EXISTS (SELECT 1 FROM shardq.executions) AS any

-- name: truncate_queue
-- Locked in the order the engine's writers lock (task rows first), so a
-- worker still finishing a turn rarely deadlocks with it; Shards.truncate
-- retries when one does.
TRUNCATE shardq.tasks, shardq.history, shardq.waits, shardq.signals, shardq.outbox,
         shardq.executions, shardq.key_queue, shardq.concurrency_keys, shardq.children

-- name: listeners
-- Worker wake listeners connected to this shard (the readiness barrier).
SELECT count(*) AS n FROM pg_stat_activity
WHERE datname = current_database() AND query = format('LISTEN %%I', shardq.wake_channel())

-- name: relay_listeners
-- Outbox relays listening on this shard (their readiness barrier).
SELECT count(*) AS n FROM pg_stat_activity
WHERE datname = current_database() AND query = format('LISTEN %%I', shardq.outbox_channel())

-- name: open_waits
-- Runs parked on this shard (relay: the sinks are in place).
SELECT count(*) AS n FROM shardq.waits

-- name: active_tasks
-- Tasks due now or leased (lease expiry is minutes away), through the tasks_due
-- index: cheap even beside a million far-future timers. The suite pins no run,
-- and tasks_due holds unpinned rows only (schema/0026).
SELECT count(*) AS n FROM shardq.tasks
WHERE run_at < now() + interval '1 day' AND build_id IS NULL

-- name: parked_runs
-- Runs parked on a wait (cycle's parking barrier): a small table, unlike a
-- count over executions, which polled every 20 ms took a tenth of the CPU the
-- measurement needs.
SELECT count(*) AS n FROM shardq.waits

-- name: open_runs
-- Nonzero while some run has not finished (a woken run, with a task and a wait
-- row, counts twice): once the queue tables are empty, every run finished.
SELECT (SELECT count(*) FROM shardq.waits) + (SELECT count(*) FROM shardq.tasks) AS n

-- name: drain_result
-- A finished run's outcome is its `run.<state>` history event.
SELECT count(*) FILTER (WHERE o.kind = 'run.completed') AS completed,
       count(*) FILTER (WHERE o.kind <> 'run.completed') AS failed,
       extract(epoch FROM max(o.recorded_at))::float8 AS last_finished
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id
    AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
WHERE x.tenant = 'default' AND x.workflow_name = %(workflow)s AND x.workflow_id LIKE %(prefix)s

-- name: failed_sample
SELECT x.workflow_id, substr(o.kind, 5) AS state, left(o.payload::text, 600) AS error
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id
    AND o.kind IN ('run.failed', 'run.cancelled', 'run.timed_out')
WHERE x.tenant = 'default' AND x.workflow_name = %(workflow)s AND x.workflow_id LIKE %(prefix)s
LIMIT 3

-- name: wake_outputs
SELECT x.workflow_id, (o.payload->'output')::text AS output,
       extract(epoch FROM o.recorded_at)::float8 AS finished
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id AND o.kind = 'run.completed'
WHERE x.tenant = 'default' AND x.workflow_name = 'wake_probe'

-- name: claim_probe_outputs
-- When each claim_probe run's first step ran (limits: time to claim).
SELECT x.workflow_id, (o.payload->'output'->>'claimed_at')::float8 AS claimed_at
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id AND o.kind = 'run.completed'
WHERE x.tenant = 'default' AND x.workflow_name = 'claim_probe'

-- name: due_tasks
-- Tasks due and not leased: the backlog a flood keeps up (limits).
SELECT count(*) AS n FROM shardq.tasks
WHERE run_at <= now() AND build_id IS NULL AND (leased_until IS NULL OR leased_until <= now())

-- name: keyed_live_leases
-- Per concurrency key, its task rows under a live lease (limits: the sampler
-- of limit_violations, every 10 ms per shard); the ids tell one run on two
-- shards (a move copies a keyed run's lease with it) from two runs.
SELECT concurrency_key AS key, count(*) AS n, array_agg(execution_id::text) AS ids
FROM shardq.tasks
WHERE concurrency_key IS NOT NULL AND leased_until > now()
GROUP BY 1

-- name: keyed_leftovers
-- After a keyed drain: task rows and runs still waiting for a slot (both must be 0).
SELECT (SELECT count(*) FROM shardq.tasks) AS tasks,
       (SELECT count(*) FROM shardq.key_queue) AS waiting

-- name: keyed_open
-- Runs not finished yet in a keyed drain: task rows (due, leased) and runs waiting for a slot.
SELECT (SELECT count(*) FROM shardq.tasks) + (SELECT count(*) FROM shardq.key_queue) AS n

-- name: analyze_keyed
-- The key tables after a bulk start of keyed runs, as autovacuum would analyze
-- them (most of a keyed backlog waits in key_queue); both sides of the ratio run it.
ANALYZE shardq.key_queue, shardq.concurrency_keys

-- name: tenant_claims
-- Every finished `claim_probe` run of a drain with its tenant and when its first
-- step ran, right after its claim (limits: fairness_jain counts each tenant's
-- runs claimed in a window); NULL for a run that did not complete.
SELECT x.tenant, o.kind, (o.payload->'output'->>'claimed_at')::float8 AS claimed_at
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id
    AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
WHERE x.workflow_name = 'claim_probe' AND x.workflow_id LIKE %(prefix)s

-- name: rate_limiter_forget
-- A limiter and its kept slots gone (limits: rate_limit_error starts from a
-- fresh cell; the queue's truncation leaves both tables alone). The workers
-- declare it again when they start.
WITH r AS (DELETE FROM shardq.rate_reservations WHERE limiter = %(name)s)
DELETE FROM shardq.rate_limiters WHERE name = %(name)s

-- name: rated_starts
-- When each `rated` run's limited step started (its output), in epoch seconds.
SELECT (o.payload->>'output')::float8 AS started_at
FROM shardq.executions x
JOIN shardq.history o ON o.execution_id = x.id AND o.kind = 'run.completed'
WHERE x.tenant = 'default' AND x.workflow_name = 'rated' AND x.workflow_id LIKE %(prefix)s

-- name: vacuum_queue
-- After bulk-loading parked runs: what autovacuum does after a million inserts.
VACUUM (ANALYZE) shardq.executions, shardq.tasks, shardq.waits, shardq.history

-- name: vacuum_dead
-- Between drains: the dead rows a drain leaves, removed as the queue tables'
-- autovacuum settings would have by then (the statistics are left to the
-- drain's own analyze_as_autovacuum).
VACUUM shardq.executions, shardq.tasks, shardq.waits, shardq.history

-- name: analyze_rules
-- What autovacuum's analyze trigger compares a table's changed rows against,
-- and the rows changed since the table's last ANALYZE.
SELECT c.relname AS name, greatest(c.reltuples, 0)::float8 AS reltuples,
       coalesce(s.n_mod_since_analyze, 0)::float8 AS changed,
       coalesce((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'autovacuum_analyze_scale_factor')::float8,
                current_setting('autovacuum_analyze_scale_factor')::float8) AS scale,
       coalesce((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'autovacuum_analyze_threshold')::float8,
                current_setting('autovacuum_analyze_threshold')::float8) AS threshold
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = 'shardq' AND c.relname = ANY(%(tables)s::text[])

-- name: checkpoint
CHECKPOINT

-- name: stat_statements_reset
SELECT pg_stat_statements_reset()

-- name: stat_statements_top
SELECT calls, round(total_exec_time::numeric, 1)::float8 AS total_ms,
       round(mean_exec_time::numeric, 3)::float8 AS mean_ms, rows,
       left(regexp_replace(query, '\s+', ' ', 'g'), 140) AS query
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC
LIMIT %(limit)s

-- name: wal_insert_lsn
-- Where the server inserts its next WAL record: the difference of two readings
-- is every byte of WAL written between them, on the whole server (all its
-- databases). The insert position, not pg_current_wal_lsn(), which trails it
-- by what sits in the WAL buffers unwritten.
SELECT pg_current_wal_insert_lsn()::text AS lsn

-- name: wal_since
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %(start)s::pg_lsn)::bigint AS bytes,
       least(pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn())::text AS readable_end

-- name: wal_by_rmgr
-- The WAL between two positions by resource manager (pg_walinspect, a contrib
-- extension that needs no preloading): Heap and Heap2 are table rows, Btree
-- index maintenance, Transaction the commit records; fpi_size the full-page
-- images among them.
-- Its columns by position (the first is named "resource_manager/record_type").
SELECT rmgr, records, record_bytes, fpi_bytes, bytes
FROM pg_get_wal_stats(%(start)s::pg_lsn, %(end)s::pg_lsn, false)
     AS s(rmgr, records, records_pct, record_bytes, record_pct, fpi_bytes, fpi_pct, bytes,
          bytes_pct)
WHERE records > 0

-- name: wal_by_relation
-- The same WAL by the relation each record is for (its first block reference,
-- as database oid and file node; none for a commit record): which table and
-- which index a byte went to, named by relation_names in each database.
SELECT rel[1]::oid::bigint AS db, rel[2]::oid::bigint AS filenode, count(*) AS records,
       sum(record_length)::bigint AS bytes, sum(fpi_length)::bigint AS fpi_bytes
FROM (SELECT (regexp_match(block_ref, 'rel \d+/(\d+)/(\d+)')) AS rel,
             record_length, fpi_length
      FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)) r
GROUP BY 1, 2

-- name: relation_names
-- This database's oid, and its relations by file node (for wal_by_relation).
SELECT (SELECT oid FROM pg_database WHERE datname = current_database())::bigint AS db,
       pg_relation_filenode(c.oid)::bigint AS filenode, c.relname
FROM pg_class c WHERE pg_relation_filenode(c.oid) IS NOT NULL

-- name: database_oid
SELECT oid::bigint AS oid FROM pg_database WHERE datname = current_database()

-- name: statements_snapshot
-- Every statement pg_stat_statements holds for these databases, as JSON rows so
-- that the columns a version lacks (toplevel before 14, wal_* before 13) are
-- simply absent.
SELECT to_jsonb(s) AS r FROM pg_stat_statements s WHERE s.dbid = ANY(%(dbids)s::oid[])

-- name: table_sizes
SELECT c.relname AS name, c.reltuples::bigint AS rows,
       pg_total_relation_size(c.oid) AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'shardq' AND c.relkind = 'r'
ORDER BY c.relname

-- name: floor_create
CREATE TABLE IF NOT EXISTS shardq_bench.q (
    id     bigint PRIMARY KEY,
    locked boolean NOT NULL DEFAULT false
)

-- name: commit_probe_create
CREATE TABLE IF NOT EXISTS shardq_bench.commit_probe (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())

-- name: commit_probe
INSERT INTO shardq_bench.commit_probe DEFAULT VALUES

-- name: floor_schema
CREATE SCHEMA IF NOT EXISTS shardq_bench

-- name: floor_truncate
TRUNCATE shardq_bench.q

-- name: floor_fill
INSERT INTO shardq_bench.q (id) SELECT i FROM generate_series(1, %(count)s) AS i

-- name: floor_vacuum
VACUUM ANALYZE shardq_bench.q

-- name: floor_drop
DROP SCHEMA IF EXISTS shardq_bench CASCADE

-- name: floor_claim
UPDATE shardq_bench.q SET locked = true
WHERE id IN (SELECT id FROM shardq_bench.q WHERE NOT locked ORDER BY id
             FOR UPDATE SKIP LOCKED LIMIT %(k)s)
RETURNING id

-- name: floor_delete
DELETE FROM shardq_bench.q WHERE id = ANY(%(ids)s)

-- name: insert_parked
-- Parked runs written straight into the engine's tables (benchmarks/parked.py,
-- which mints the execution ids as Client.start does and says which run is
-- which): `park` runs waiting on signal "go" (a wait, no task) and `nap` runs
-- on a 90-day timer (a wait and a task with run_at ~ now() + 90 days). Each has
-- the one history event its first turn would have written. Any change to what
-- the engine writes for these runs must be made here too: tests/acceptance/test_benchmarks.py
-- compares the two.
WITH src AS (
    SELECT u.id, u.i, u.on_signal,
           now() + %(nap_s)s * interval '1 second' + u.i * interval '1 millisecond' AS wake_at
    FROM unnest(%(ids)s::uuid[], %(nums)s::bigint[], %(on_signal)s::boolean[])
         AS u(id, i, on_signal)
), x AS (
    INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id,
                                   input)
    SELECT id, 'default', CASE WHEN on_signal THEN 'park' ELSE 'nap' END, 1,
           'parked-' || i, '{"parked": true}'::jsonb
    FROM src
), t AS (
    INSERT INTO shardq.tasks (execution_id, run_at, claims, tenant)
    SELECT id, wake_at, 1, 'default' FROM src WHERE NOT on_signal
), w AS (
    INSERT INTO shardq.waits (execution_id, position, kind, name, deadline)
    SELECT id, 0, CASE WHEN on_signal THEN 'signal' ELSE 'timer' END,
           CASE WHEN on_signal THEN 'go' ELSE 'nap' END,
           CASE WHEN on_signal THEN NULL ELSE wake_at END
    FROM src
), h AS (
    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    SELECT id, 0,
           CASE WHEN on_signal THEN 'signal.waiting' ELSE 'sleep.started' END,
           CASE WHEN on_signal THEN 'go' ELSE 'nap' END,
           CASE WHEN on_signal THEN '{"timeout": null}'::jsonb
                ELSE jsonb_build_object('seconds', %(nap_s)s, 'wake_at', wake_at) END
    FROM src
)
SELECT count(*) AS n FROM src

-- name: children_span
-- When the first and the last run of a workflow and key prefix were created, and
-- when the first and the last of them ended. Both are the writing transaction's
-- start (now()): a run created at t may be seen by workers only once its
-- creator commits, much later when that commit is large; its first run's end
-- bounds that from above.
SELECT extract(epoch FROM min(x.created_at))::float8 AS first_created,
       extract(epoch FROM max(x.created_at))::float8 AS last_created,
       extract(epoch FROM min(o.recorded_at))::float8 AS first_ended,
       extract(epoch FROM max(o.recorded_at))::float8 AS last_ended
FROM shardq.executions x
LEFT JOIN shardq.history o ON o.execution_id = x.id
    AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
WHERE x.tenant = 'default' AND x.workflow_name = %(workflow)s AND x.workflow_id LIKE %(prefix)s

-- name: bulk_schedules
-- `n` schedules of `noop` (one tick an hour, overlap allow), all due at the same
-- second, `lead_s` from now: what a ticker meets at the top of a busy minute.
WITH tick AS (SELECT date_trunc('second', now()) + make_interval(secs => %(lead_s)s) AS at),
ins AS (
    INSERT INTO shardq.schedules (name, tenant, workflow_name, input, every_s, timezone,
                                  overlap, catchup_s, next_at)
    SELECT %(prefix)s || g, 'default', 'noop', 'null'::jsonb, 3600, 'UTC', 'allow', 600,
           (SELECT at FROM tick)
    FROM generate_series(1, %(n)s) AS g
)
SELECT extract(epoch FROM (SELECT at FROM tick))::float8 AS tick

-- name: tick_count
-- The runs a shard holds: the schedules scenario's progress poll (the shards hold
-- nothing else then), as cheap as a count can be.
SELECT count(*) AS n FROM shardq.executions

-- name: tick_runs
-- The runs a schedule prefix's ticks started: how many, of how many schedules, and
-- each one's start (its creation) after the tick, in seconds.
SELECT count(*) AS runs, count(DISTINCT split_part(workflow_id, '@', 1)) AS schedules,
       coalesce(array_agg(extract(epoch FROM created_at)::float8 - %(tick)s), '{}') AS lags
FROM shardq.executions
WHERE workflow_name = 'noop' AND workflow_id LIKE %(prefix)s

-- name: template_history
-- A finished run's rows as the engine wrote them: what clone_runs copies.
SELECT h.position, h.kind, h.name, h.payload
FROM shardq.history h JOIN shardq.executions x ON x.id = h.execution_id
WHERE x.workflow_name = %(workflow)s AND x.workflow_id = %(workflow_id)s
ORDER BY h.seq

-- name: clone_runs
-- Copies of one finished run (its history rows `events`, [position, kind, name,
-- payload] each, in order) under the given ids, workflow ids `<prefix><i>`.
WITH ids AS (
    SELECT t.id, t.ord FROM unnest(%(ids)s::uuid[]) WITH ORDINALITY AS t(id, ord)
), made AS (
    INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id,
                                   input)
    SELECT i.id, 'default', %(workflow)s, 1, %(prefix)s || i.ord, 'null'::jsonb FROM ids i
)
INSERT INTO shardq.history (execution_id, position, kind, name, payload)
SELECT i.id, (e.ev->>0)::integer, e.ev->>1, e.ev->>2, e.ev->3
FROM ids i CROSS JOIN jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e(ev, o)
ORDER BY i.ord, e.o

-- name: visibility_load
-- `n` finished, waiting and pending runs of the shape the `visibility` scenario lists
-- (benchmarks/visibility.py, MIX), as the engine leaves them: the executions row,
-- the outcome event and the ended_runs row of an ended run, the waits row of a
-- waiting one, the task row of a pending one; every fourth run has search attributes
-- (schema/0030): `region` ('north', 'south', 'east', 'west', or 'rare' for one in
-- 404) and `amount` (0..999). Ids as shards/routing.new_execution_id mints them
-- (creation millisecond, version 8, a bucket of `buckets`, variant), spread evenly
-- over [first_ms, first_ms + span_ms); `salt` keeps two loads' ids apart.
-- Unlogged-fast it is not: the rows go through every index, as a start's do.
WITH made AS (
    SELECT i,
           (lpad(to_hex(%(first_ms)s::bigint + i * %(span_ms)s::bigint / %(n)s), 12, '0')
            || '8' || lpad(to_hex((%(buckets)s::int[])[1 + i %% cardinality(%(buckets)s::int[])]), 3, '0')
            || to_hex(8 + i %% 4) || lpad(to_hex(%(salt)s::int), 3, '0')
            || lpad(to_hex(i), 12, '0'))::uuid AS id,
           to_timestamp((%(first_ms)s::bigint + i * %(span_ms)s::bigint / %(n)s) / 1000.0) AS at,
           CASE WHEN i %% 97 = 0 THEN 'rare-tenant' ELSE 'default' END AS tenant,
           CASE WHEN i %% 1009 = 1 THEN 'rare_workflow'
                WHEN i %% 3 = 0 THEN 'billing' ELSE 'orders' END AS workflow,
           CASE WHEN i %% 50 = 7 THEN 'failed' WHEN i %% 100 = 13 THEN 'cancelled'
                WHEN i %% 100 = 17 THEN 'waiting' WHEN i %% 100 = 19 THEN 'pending'
                ELSE 'completed' END AS state
    FROM generate_series(0, %(n)s - 1) AS i
), runs AS (
    INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id,
                                   input, created_at)
    SELECT id, tenant, workflow, 1, 'v-' || %(salt)s || '-' || i, '{}', at FROM made
), outcomes AS (
    INSERT INTO shardq.history (execution_id, position, kind, name, payload, recorded_at)
    SELECT id, NULL, 'run.' || state, 'run',
           CASE WHEN state = 'completed' THEN '{"output": null}'::jsonb ELSE '{}' END,
           at + interval '1 second'
    FROM made WHERE state NOT IN ('waiting', 'pending')
), ended AS (
    INSERT INTO shardq.ended_runs (tenant, state, execution_id, workflow_name)
    SELECT tenant, state, id, workflow FROM made WHERE state NOT IN ('waiting', 'pending')
), due AS (
    INSERT INTO shardq.tasks (execution_id, run_at, tenant)
    SELECT id, at, tenant FROM made WHERE state = 'pending'
), attributes AS (
    INSERT INTO shardq.run_attributes (execution_id, name, tenant, value)
    SELECT id, a.name, tenant, a.value
    FROM made, LATERAL (VALUES
        ('region', to_jsonb(CASE WHEN i %% 404 = 0 THEN 'rare'
                                 ELSE (ARRAY['north', 'south', 'east', 'west'])[1 + i / 4 %% 4]
                            END)),
        ('amount', to_jsonb(i %% 1000))) AS a(name, value)
    WHERE i %% 4 = 0
)
INSERT INTO shardq.waits (execution_id, position, kind, name, started_at)
SELECT id, 0, 'signal', 'approval', at FROM made WHERE state = 'waiting'

-- name: visibility_default_runs
-- The default tenant's runs a visibility shard holds, counted row by row: what
-- count_runs must answer without reading them.
SELECT count(*) AS n FROM shardq.executions WHERE tenant = 'default'
