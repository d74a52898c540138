-- When the next of `build`'s pinned runs falls due for a claim (schema/0026):
-- its next timer, or the first expiry among the live leases at the head of its
-- due rows (read up to 1,000, as shardq.claim_tasks() reads tasks_due's head).
-- NULL when the build has no task row. Both reads are ranges of tasks_pinned.
CREATE OR REPLACE FUNCTION shardq.pinned_due(build text, claimable bit(4096))
RETURNS timestamptz
LANGUAGE sql STABLE
AS $$
    SELECT least(
        (SELECT min(t.run_at) FROM shardq.tasks t
         WHERE t.build_id = build AND t.run_at > now()
           AND (claimable IS NULL OR get_bit(claimable, shardq.bucket(t.execution_id)) = 1)),
        (SELECT min(coalesce(h.leased_until, h.run_at)) FROM (
             SELECT t.run_at, t.leased_until FROM shardq.tasks t
             WHERE t.build_id = build AND t.run_at <= now()
               AND (claimable IS NULL
                    OR get_bit(claimable, shardq.bucket(t.execution_id)) = 1)
             ORDER BY t.build_id, t.run_at LIMIT 1000) h))
$$;
