-- The one name of the channel a shard's workers LISTEN on: every NOTIFY that
-- makes work due (start, signal delivery, released leases) and the workers'
-- LISTEN ask this function. IMMUTABLE, so it is folded to a constant when a
-- calling statement is planned and costs the hot paths nothing.
-- 'shardq.wake' names the schema as every statement does, so a shard in schema s07
-- (shards/layout.py) notifies s07_wake: shards sharing a database hear their own.
CREATE OR REPLACE FUNCTION shardq.wake_channel() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT replace('shardq.wake', '.', '_') $$;
