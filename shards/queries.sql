-- The shard layer's own bookkeeping: which migrations ran, and which map the
-- shard belongs to. Every other table is the queue store's (store/queries.sql)
-- or the mover's (moves/queries.sql); the mover also runs the statements here
-- that read and write map versions, the schema version and the mover's lock.

-- name: take_migration_lock
SELECT pg_advisory_lock(%(key)s)

-- name: release_migration_lock
SELECT pg_advisory_unlock(%(key)s)

-- name: create_bookkeeping
-- The schema is named as `shardq.` is written, so that a shard in a schema of its own
-- (shards/layout.py) makes that one.
DO $$ BEGIN EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', rtrim('shardq.', '.')); END $$;
CREATE TABLE IF NOT EXISTS shardq.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
-- Every body each function file ever had on this shard (see shards/migrations.py).
CREATE TABLE IF NOT EXISTS shardq.schema_functions (
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, checksum)
);
CREATE TABLE IF NOT EXISTS shardq.shard_identity (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_name  text NOT NULL,
    fingerprint text NOT NULL,
    layout      jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- name: applied_migrations
SELECT version, name, checksum FROM shardq.schema_migrations ORDER BY version

-- name: record_migration
INSERT INTO shardq.schema_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s)

-- name: applied_functions
SELECT name, checksum FROM shardq.schema_functions

-- name: existing_functions
-- (the schema's name as `shardq.` is written, so that a shard's own schema is read)
SELECT p.proname AS name FROM pg_proc p
WHERE p.pronamespace = rtrim('shardq.', '.')::regnamespace

-- name: record_function
INSERT INTO shardq.schema_functions (name, checksum) VALUES (%(name)s, %(checksum)s)
ON CONFLICT DO NOTHING

-- name: read_identity
SELECT shard_name, fingerprint, layout::text AS layout FROM shardq.shard_identity

-- name: record_identity
INSERT INTO shardq.shard_identity (shard_name, fingerprint, layout)
VALUES (%(shard_name)s, %(fingerprint)s, %(layout)s::jsonb)

-- name: shard_status
SELECT
    to_regclass('shardq.schema_migrations') IS NOT NULL AS has_bookkeeping,
    to_regclass('shardq.schema_functions') IS NOT NULL AS has_function_bookkeeping,
    current_setting('server_version') AS server_version

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM shardq.schema_migrations

-- name: defer_body_checks
SET LOCAL check_function_bodies = off

-- name: has_map_versions
SELECT to_regclass('shardq.ownership') IS NOT NULL AS present

-- name: read_first_version
SELECT o.deployment, m.layout::text AS layout
FROM shardq.ownership o JOIN shardq.shard_maps m ON m.version = 1

-- name: record_map_version
INSERT INTO shardq.shard_maps (version, layout) VALUES (%(version)s, %(layout)s::jsonb)

-- name: record_ownership
INSERT INTO shardq.ownership (deployment, map_version, writable, owned)
VALUES (%(deployment)s, %(map_version)s, %(owned)s::bit(4096), %(owned)s::bit(4096))

-- name: read_map_state
-- A shard's deployment and the newest map version it holds (a process starts from
-- the newest among its seeds, and follows a newer one it finds later).
SELECT o.deployment, m.version, m.layout::text AS layout
FROM shardq.ownership o
LEFT JOIN LATERAL (
    SELECT version, layout FROM shardq.shard_maps ORDER BY version DESC LIMIT 1
) m ON true

-- name: read_map_version
SELECT layout::text AS layout FROM shardq.shard_maps WHERE version = %(version)s

-- name: read_newer_map
-- The newest version after the caller's, with the shard's deployment: what a
-- refusal or the slow poll reads.
SELECT m.version, m.layout::text AS layout, o.deployment
FROM shardq.shard_maps m CROSS JOIN shardq.ownership o
WHERE m.version > %(after)s
ORDER BY m.version DESC
LIMIT 1

-- name: take_version
-- A version this shard takes part in: written with its row, in one transaction,
-- so the version a refusal names is always there to read.
UPDATE shardq.ownership SET map_version = %(version)s WHERE map_version < %(version)s

-- name: record_map_version_once
INSERT INTO shardq.shard_maps (version, layout) VALUES (%(version)s, %(layout)s::jsonb)
ON CONFLICT (version) DO NOTHING

-- name: read_ownership
SELECT deployment, map_version, bit_count(owned) AS owned, bit_count(writable) AS writable,
       unclean
FROM shardq.ownership

-- name: count_runs
-- For `shardq shards status`: exact, one scan of the primary key (status is rare).
-- Runs of the buckets the shard owns: until a move's cleanup, its source keeps a copy
-- of runs the target owns, which would be counted on both. A clean shard holds
-- nothing else, and skips the per-row bucket.
SELECT CASE WHEN o.unclean
            THEN (SELECT count(*) FROM shardq.executions e
                  WHERE get_bit(o.owned, shardq.bucket(e.id)) = 1)
            ELSE (SELECT count(*) FROM shardq.executions) END AS runs
FROM shardq.ownership o

-- name: server_identity
-- Tells one server's database from another spelled differently (localhost and
-- 127.0.0.1, a second port forwarded to the same server).
-- (pg_control_system() would be exact but is not granted to every role; a
-- server's start time to the microsecond and its port tell servers apart as well.)
SELECT pg_postmaster_start_time()::text || ':' || current_setting('port') AS server,
       current_database() AS dbname

-- name: try_mover_lock
-- The mover's lock on home: a move holds it for its whole run (moves/store.py),
-- a map change while it writes a version.
SELECT pg_try_advisory_lock(%(key)s) AS locked

-- name: release_mover_lock
SELECT pg_advisory_unlock(%(key)s)

-- name: server_version_num
SELECT current_setting('server_version_num')::integer AS num,
       current_setting('server_version') AS text

-- name: database_contents
-- What a database that `shards add` is given holds, per schema of its own (the
-- system's left out): relations (tables, views, sequences, indexes, types of
-- rows), functions, and domains, enums and ranges. A new database has an empty
-- public schema and nothing else.
SELECT n.nspname AS schema,
       (SELECT count(*) FROM pg_class c WHERE c.relnamespace = n.oid) AS relations,
       (SELECT count(*) FROM pg_proc p WHERE p.pronamespace = n.oid) AS functions,
       (SELECT count(*) FROM pg_type t
        WHERE t.typnamespace = n.oid AND t.typtype IN ('d', 'e', 'r', 'm')) AS types,
       (SELECT string_agg(c.relname, ', ' ORDER BY c.relname)
        FROM (SELECT relname FROM pg_class WHERE relnamespace = n.oid AND relkind IN
              ('r', 'p', 'v', 'm', 'f') ORDER BY relname LIMIT 3) AS c) AS some_tables
FROM pg_namespace n
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname !~ '^pg_(toast|temp_)'
ORDER BY n.nspname

-- name: drop_new_shard_schema
-- Only on a database `shards add` found without a shardq schema, after its
-- migration failed: everything in it is what that migration created.
DO $$ BEGIN EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', rtrim('shardq.', '.')); END $$

-- name: liveness_probe
-- A server's answer to "do you answer at all" (shards/liveness.py), on a fresh connection.
SELECT 1 AS answers

-- name: read_tenant_weights
-- An operator's tenant weights (schema/0021), which every shard holds alike.
SELECT tenant, weight FROM shardq.tenant_weights ORDER BY tenant

-- name: copy_tenant_weights
-- A new shard takes the weights the home shard holds (`shardq shards add`).
INSERT INTO shardq.tenant_weights (tenant, weight)
SELECT * FROM unnest(%(tenants)s::text[], %(weights)s::int[])
ON CONFLICT (tenant) DO UPDATE SET weight = excluded.weight, updated_at = now()

-- name: read_workflow_builds
-- Workflows' current builds (schema/0026), which every shard holds alike.
SELECT workflow_name, build_id, pinned FROM shardq.workflow_builds ORDER BY workflow_name

-- name: copy_workflow_builds
-- A new shard takes the builds the home shard holds (`shardq shards add`).
INSERT INTO shardq.workflow_builds AS b (workflow_name, build_id, pinned)
SELECT * FROM unnest(%(workflows)s::text[], %(builds)s::text[], %(pinned)s::boolean[])
ON CONFLICT (workflow_name) DO UPDATE
SET build_id = excluded.build_id, pinned = excluded.pinned, updated_at = now()
