-- The shard layer's own bookkeeping: which migrations ran, and which map the
-- shard belongs to. Every other table is the queue store's (queue/queries.sql).

-- name: take_migration_lock
SELECT pg_advisory_lock(%(key)s)

-- name: release_migration_lock
SELECT pg_advisory_unlock(%(key)s)

-- name: create_bookkeeping
CREATE SCHEMA IF NOT EXISTS shardq;
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
SELECT p.proname AS name FROM pg_proc p WHERE p.pronamespace = 'shardq'::regnamespace

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
