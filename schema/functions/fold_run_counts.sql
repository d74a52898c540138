-- Fold the appended count changes into run_counts (schema/0029), one folder a
-- shard at a time; answers how many change rows it folded (0 when another folder
-- holds the shard). Changes committed after the DELETE's snapshot stay for the
-- next fold; counters are added to in key order, so two folds never deadlock
-- even without the lock. A counter that reached 0 is removed (a workflow whose
-- runs were all purged), found among the ones this fold changed.
CREATE OR REPLACE FUNCTION shardq.fold_run_counts() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    folded    bigint;
    zero_t    text[];
    zero_w    text[];
    zero_k    text[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('shardq.fold_run_counts')) THEN
        RETURN 0;
    END IF;
    WITH gone AS (
        DELETE FROM shardq.run_count_changes RETURNING tenant, workflow_name, kind, n
    ), sums AS (
        SELECT tenant, workflow_name, kind, sum(n) AS n, count(*) AS rows
        FROM gone GROUP BY 1, 2, 3
    ), counted AS (
        INSERT INTO shardq.run_counts AS c (tenant, workflow_name, kind, n)
        SELECT tenant, workflow_name, kind, n FROM sums ORDER BY 1, 2, 3
        ON CONFLICT (tenant, workflow_name, kind) DO UPDATE SET n = c.n + excluded.n
        RETURNING c.tenant, c.workflow_name, c.kind, c.n
    )
    SELECT (SELECT coalesce(sum(s.rows), 0) FROM sums s),
           array_agg(u.tenant) FILTER (WHERE u.n = 0),
           array_agg(u.workflow_name) FILTER (WHERE u.n = 0),
           array_agg(u.kind) FILTER (WHERE u.n = 0)
    INTO folded, zero_t, zero_w, zero_k
    FROM counted u;
    IF zero_t IS NOT NULL THEN
        DELETE FROM shardq.run_counts c
        USING unnest(zero_t, zero_w, zero_k) AS z(tenant, workflow_name, kind)
        WHERE c.tenant = z.tenant AND c.workflow_name = z.workflow_name AND c.kind = z.kind
          AND c.n = 0;
    END IF;
    RETURN folded;
END
$$;
