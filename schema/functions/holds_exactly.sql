-- Reads of many runs while buckets move (docs/design/growing.md, 4.6): a reader
-- holds one map version for its whole read and passes each shard the buckets
-- that version gives it (`mine`). A batch being moved has rows on its source
-- and its target for a while; filtered by `mine`, each run is read on one
-- shard only, whichever version the reader holds. The filter is
--   (SELECT shardq.holds_exactly(mine)) OR get_bit(mine, shardq.bucket(<id>)) = 1
-- and this is its fast path: true when the shard holds rows of exactly those
-- buckets (it is clean and owns `mine`), so no row needs its bucket read.
-- plpgsql, not sql: it keeps its plan for the session (see run_state.sql).
CREATE OR REPLACE FUNCTION shardq.holds_exactly(mine bit(4096)) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT NOT o.unclean AND o.owned = mine FROM shardq.ownership o), false);
END
$$;
