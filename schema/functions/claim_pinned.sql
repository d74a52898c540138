-- The pinned part of a claim (schema/0026; docs/versioning.md, "Builds"): up
-- to `want` due runs pinned to `build`, higher priority first, then by due
-- time, skipping `taken` (rows this transaction locked already, which SKIP
-- LOCKED does not skip). Called by shardq.claim_tasks(), in its transaction:
-- the rows it answers are locked, and the claim leases them with the rest.
--
-- As the unpinned claim does, from indexes of their own: a level's due rows
-- from tasks_pinned_urgent (one probe for each level the build has), priority
-- 0 from tasks_pinned; both keyed by build first, so a build's claim reads
-- its own rows and stops at now(). No fair sharing between tenants here: a
-- build's pinned runs are the runs started while it was current, served in
-- due order.
CREATE OR REPLACE FUNCTION shardq.claim_pinned(
    build text, min_priority smallint, want integer, claimable bit(4096), taken uuid[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    runs  uuid[] := '{}';
    level smallint;
BEGIN
    level := (SELECT max(t.priority) FROM shardq.tasks t
              WHERE t.build_id = build AND t.priority > 0);
    WHILE level >= greatest(min_priority, 1) AND cardinality(runs) < want LOOP
        runs := runs || ARRAY(
            SELECT d.execution_id
            FROM shardq.tasks d
            WHERE d.build_id = build AND d.priority = level AND d.run_at <= now()
              AND (d.leased_until IS NULL OR d.leased_until <= now())
              AND (claimable IS NULL OR get_bit(claimable, shardq.bucket(d.execution_id)) = 1)
              AND d.execution_id <> ALL(taken)
            ORDER BY d.build_id, d.priority DESC, d.run_at
            LIMIT want - cardinality(runs)
            FOR UPDATE SKIP LOCKED);
        level := (SELECT max(t.priority) FROM shardq.tasks t
                  WHERE t.build_id = build AND t.priority > 0 AND t.priority < level);
    END LOOP;
    IF min_priority = 0 AND cardinality(runs) < want THEN
        runs := runs || ARRAY(
            SELECT d.execution_id
            FROM shardq.tasks d
            WHERE d.build_id = build AND d.priority = 0 AND d.run_at <= now()
              AND (d.leased_until IS NULL OR d.leased_until <= now())
              AND (claimable IS NULL OR get_bit(claimable, shardq.bucket(d.execution_id)) = 1)
              AND d.execution_id <> ALL(taken)
            ORDER BY d.build_id, d.run_at
            LIMIT want - cardinality(runs)
            FOR UPDATE SKIP LOCKED);
    END IF;
    RETURN runs;
END
$$;
