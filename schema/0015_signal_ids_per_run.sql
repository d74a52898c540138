-- A signal's id is unique per run, not per shard (growing, build step 2;
-- docs/design/growing.md, section 4.4). Moving a run to another shard keeps
-- its signals' ids: they are shown to users (an update's id, `signal_id` in a
-- signal's answer, replay's consumed set), so they cannot be renumbered. Two
-- shards draw ids from sequences of their own, so a moved signal's id may
-- already belong to a signal of another run on the target: only the pair
-- (run, id) is unique across a deployment.
--
-- Every statement that finds signals by id also names their run (a commit
-- consumes its own run's signals), so the new key serves them all.
--
-- Building the new key locks writes to `signals` for as long as the build
-- takes; on a large table, run beforehand, by hand:
--   CREATE UNIQUE INDEX CONCURRENTLY signals_run_id ON shardq.signals (execution_id, id);
-- and this migration takes that index as the key instead of building one.
DO $$
BEGIN
    IF to_regclass('shardq.signals_run_id') IS NULL THEN
        CREATE UNIQUE INDEX signals_run_id ON shardq.signals (execution_id, id);
    END IF;
END
$$;
ALTER TABLE shardq.signals DROP CONSTRAINT signals_pkey;
ALTER TABLE shardq.signals ADD CONSTRAINT signals_pkey PRIMARY KEY USING INDEX signals_run_id;
