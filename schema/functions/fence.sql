-- The fence of a write (growing; docs/design/growing.md, section 3.3): raise
-- unless every id's bucket is writable on this shard, so the caller's whole
-- transaction rolls back and nothing of it is stored. Only this shard's own
-- ownership row decides, in the writing transaction: no process's map is
-- trusted with it.
--
-- It takes the transaction's xid first and reads the ownership row after, in
-- a snapshot of its own (a statement of a volatile function, READ COMMITTED):
-- that is what a move's freeze relies on. A writer either had its xid when the
-- freeze committed, and the mover waits for it to end before it copies, or it
-- reads the freeze here and is refused. So it may be called anywhere in the
-- writing transaction: as a statement, or inside the writing statement as an
-- uncorrelated subquery (`WHERE (SELECT shardq.fence(ids))`, evaluated once).
-- It returns true, or raises.
--
-- Refusals, each with a JSON detail {"bucket", "map_version", "move", "target"}:
--   SQ001 fenced:    the bucket is owned here but frozen by a move: retry soon.
--   SQ002 not_owner: the bucket belongs to another shard: read the map version
--                    named (it is in shardq.shard_maps here) and go there.
-- A shard with no ownership row was migrated by a release before map versions:
-- it owns what its map says, as before.
CREATE OR REPLACE FUNCTION shardq.fence(ids uuid[]) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    own    shardq.ownership;
    bucket integer;
BEGIN
    PERFORM pg_current_xact_id();
    SELECT * INTO own FROM shardq.ownership;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    bucket := shardq.first_unset_bucket(ids, own.writable);
    IF bucket IS NULL THEN
        RETURN true;
    END IF;
    IF get_bit(own.owned, bucket) = 0 THEN
        PERFORM shardq.owns(ids);  -- raises SQ002, as a read of a bucket not owned does
    END IF;
    RAISE EXCEPTION 'bucket % is frozen by move % to %', bucket, own.fence_move,
        own.fence_target
        USING ERRCODE = 'SQ001',
              DETAIL = json_build_object('bucket', bucket, 'map_version', own.map_version,
                                         'move', own.fence_move,
                                         'target', own.fence_target)::text;
END
$$;
