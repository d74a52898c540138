-- The buckets this shard can write, while it also holds rows of buckets it
-- cannot (a move froze them, or moved them away and has not cleaned up yet);
-- NULL on a clean shard, whose every row is writable. Statements that pick
-- rows to work on (claims, heartbeats, the outbox relay) skip the others with
--   (SELECT shardq.unclean_writable()) IS NULL
--   OR get_bit((SELECT shardq.unclean_writable()), shardq.bucket(<id>)) = 1
-- which costs a clean shard one read of the ownership row per statement (the
-- subqueries run once) and nothing per row.
-- plpgsql, not sql: it keeps its plan for the session (see run_state.sql).
CREATE OR REPLACE FUNCTION shardq.unclean_writable() RETURNS bit(4096)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT o.writable FROM shardq.ownership o WHERE o.unclean);
END
$$;
