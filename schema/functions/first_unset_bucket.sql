-- The bucket of the first id whose bit in `mask` is not set, NULL when every
-- id's is: how the fences find a bucket to refuse (fence.sql: not writable,
-- owns.sql: not owned).
-- plpgsql, not sql: it keeps its plan for the session (see run_state.sql).
CREATE OR REPLACE FUNCTION shardq.first_unset_bucket(ids uuid[], mask bit(4096))
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN (SELECT x.b
            FROM unnest(ids) AS i(id), LATERAL (SELECT shardq.bucket(i.id) AS b) AS x
            WHERE get_bit(mask, x.b) = 0
            LIMIT 1);
END
$$;
