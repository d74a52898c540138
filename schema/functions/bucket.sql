-- The bucket an execution id was minted for, as shards/routing.py's bucket_of
-- reads it: the low nibble of byte 6 and byte 7. A bucket range is not a uuid
-- range (the timestamp comes first), so every statement about the runs of a
-- bucket range needs this expression. IMMUTABLE and one expression, so the
-- planner inlines it and an index may be built on it; once one is, this body
-- must never change (CREATE OR REPLACE would not rebuild the index).
CREATE OR REPLACE FUNCTION shardq.bucket(id uuid) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ((get_byte(uuid_send(id), 6) & 15) << 8) | get_byte(uuid_send(id), 7) $$;
