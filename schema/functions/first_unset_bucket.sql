-- The bucket of the first id whose bit in `mask` is not set, NULL when every
-- id's is: how the fences find a bucket to refuse (fence.sql: not writable,
-- owns.sql: not owned).
CREATE OR REPLACE FUNCTION shardq.first_unset_bucket(ids uuid[], mask bit(4096))
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT x.b
    FROM unnest(ids) AS i(id), LATERAL (SELECT shardq.bucket(i.id) AS b) AS x
    WHERE get_bit(mask, x.b) = 0
    LIMIT 1
$$;
