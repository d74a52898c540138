-- The fence of a read of runs by id: true when this shard owns every id's
-- bucket, else SQ002 (not_owner, as shardq.fence raises it), so a reader whose
-- map is older than a move follows it to the owner instead of reading the
-- copy a move left behind (until the source's cleanup deletes it) or finding
-- nothing there. A bucket frozen by a move is still owned and read here: its
-- rows cannot change until the switch. Used as a one-time filter:
--   WHERE ... AND (SELECT shardq.owns(<ids>))
CREATE OR REPLACE FUNCTION shardq.owns(ids uuid[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    own    shardq.ownership;
    bucket integer;
BEGIN
    SELECT * INTO own FROM shardq.ownership;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    bucket := shardq.first_unset_bucket(ids, own.owned);
    IF bucket IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'bucket % is not owned by this shard (map version %)', bucket,
        own.map_version
        USING ERRCODE = 'SQ002',
              DETAIL = json_build_object('bucket', bucket, 'map_version', own.map_version,
                                         'move', NULL, 'target', NULL)::text;
END
$$;
