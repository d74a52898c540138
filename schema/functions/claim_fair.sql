-- The fair part of a claim (schema/0021; docs/flow-control.md): up to `want`
-- due priority-0 runs, shared between the tenants that have some, by weight.
-- Called by shardq.claim_tasks(), in its transaction; the rows it answers are
-- locked, and the claim leases them with the rest of its batch.
--
-- The tenants come from a loose scan of tasks_fair, one descent each, from
-- after the caller's cursor round to the start, at most 32 a claim: a thousand
-- tenants cost a claim 32 descents, and the cursor walks on through the rest
-- claim after claim. Each round gives every tenant a part of what is left in
-- proportion to its weight (shardq.tenant_weights, 1 without a row), at least
-- one run, and takes it from the head of that tenant's due rows; what a tenant
-- could not use goes, in up to two more rounds, to those that used all of
-- theirs. A lone tenant has nothing to share: the caller takes its runs in due
-- order, as before fairness.
--
-- Answers the runs taken, the tenant the caller's next claim starts after, and
-- how many runs the caller should still take from tasks_due in due order: what
-- is left when tenants past the 32 may have due work, or some were still full
-- after three rounds; none when every tenant was visited and ran out.
--
-- Unpinned rows only (schema/0026): tasks_fair holds no pinned row, and a
-- build's pinned runs are claimed by shardq.claim_pinned.
--
-- Generic plans, unlike the claim's own statements: every statement here finds
-- its rows by tenant, which a plan need not guess about, and planning the
-- sharing statement afresh cost about as much as running it (measured: a claim
-- of 100 over 10 tenants, 2.1 ms with custom plans, 1.6 ms with generic ones).
-- No bitmap scans: a generic plan cannot know a tenant's share is small, and
-- chose to fetch every due row of the tenant, then sort them, where a flood's
-- tenant has a hundred thousand; an index scan of tasks_fair reads its share.
CREATE OR REPLACE FUNCTION shardq.claim_fair(
    after_tenant text, want integer, claimable bit(4096),
    OUT runs uuid[], OUT cursor_at text, OUT rest integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan SET enable_bitmapscan = off AS $$
DECLARE
    tenants text[] := '{}';
    fullest text[];
    share   record;
    walked  boolean;  -- every tenant visited: fewer than the cap
BEGIN
    runs := '{}';
    cursor_at := after_tenant;
    rest := want;
    -- From after the cursor to the last tenant, then from the first up to the
    -- cursor: each step one descent of tasks_fair.
    IF after_tenant IS NOT NULL THEN
        tenants := ARRAY(
            WITH RECURSIVE walk(tenant, n) AS (
                SELECT (SELECT min(t.tenant) FROM shardq.tasks t
                        WHERE t.priority = 0 AND t.build_id IS NULL
                          AND t.tenant > after_tenant), 1
                UNION ALL
                SELECT (SELECT min(t.tenant) FROM shardq.tasks t
                        WHERE t.priority = 0 AND t.build_id IS NULL
                          AND t.tenant > w.tenant), w.n + 1
                FROM walk w WHERE w.tenant IS NOT NULL AND w.n < 32
            )
            SELECT w.tenant FROM walk w WHERE w.tenant IS NOT NULL ORDER BY w.n);
    END IF;
    IF cardinality(tenants) < 32 THEN
        tenants := tenants || ARRAY(
            WITH RECURSIVE walk(tenant, n) AS (
                SELECT (SELECT min(t.tenant) FROM shardq.tasks t
                        WHERE t.priority = 0 AND t.build_id IS NULL),
                       cardinality(tenants) + 1
                UNION ALL
                SELECT (SELECT min(t.tenant) FROM shardq.tasks t
                        WHERE t.priority = 0 AND t.build_id IS NULL
                          AND t.tenant > w.tenant), w.n + 1
                FROM walk w
                WHERE w.tenant IS NOT NULL AND w.n < 32
                  AND (after_tenant IS NULL OR w.tenant < after_tenant)
            )
            SELECT w.tenant FROM walk w
            WHERE w.tenant IS NOT NULL AND (after_tenant IS NULL OR w.tenant <= after_tenant)
            ORDER BY w.n);
    END IF;
    IF cardinality(tenants) <= 1 THEN
        RETURN;  -- nothing to share: all of it in due order
    END IF;
    walked := cardinality(tenants) < 32;

    FOR pass IN 1..3 LOOP
        EXIT WHEN rest <= 0 OR cardinality(tenants) = 0;
        fullest := '{}';
        -- One statement a round: each tenant's part (by weight, at least one, none
        -- past what is left, in walk order), taken from the head of its due rows.
        FOR share IN
            WITH weighed AS (
                SELECT v.tenant, v.ord, coalesce(w.weight, 1) AS weight
                FROM unnest(tenants) WITH ORDINALITY AS v(tenant, ord)
                LEFT JOIN shardq.tenant_weights w ON w.tenant = v.tenant
            ), shared AS (
                SELECT x.tenant, x.ord, greatest(1, round(
                           rest::numeric * x.weight / sum(x.weight) OVER ()))::integer AS n
                FROM weighed x
            ), capped AS (
                SELECT x.tenant, x.ord, least(x.n, rest - coalesce(sum(x.n) OVER (
                           ORDER BY x.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                           0))::integer AS n
                FROM shared x
            )
            SELECT c.tenant, c.n, coalesce(d.ids, '{}') AS ids
            FROM capped c
            CROSS JOIN LATERAL (
                SELECT array_agg(r.execution_id) AS ids FROM (
                    SELECT d.execution_id
                    FROM shardq.tasks d
                    WHERE d.tenant = c.tenant AND d.priority = 0 AND d.build_id IS NULL
                      AND d.run_at <= now()
                      AND (d.leased_until IS NULL OR d.leased_until <= now())
                      AND (claimable IS NULL
                           OR get_bit(claimable, shardq.bucket(d.execution_id)) = 1)
                      -- Rows an earlier round took are locked by this transaction,
                      -- which SKIP LOCKED does not skip.
                      AND d.execution_id <> ALL(runs)
                    -- By tenant too, though it is one: the order of tasks_fair,
                    -- which a planner could otherwise trade for tasks_due and a
                    -- filter that reads the other tenants' rows (a flood's).
                    ORDER BY d.tenant, d.run_at
                    LIMIT c.n
                    FOR UPDATE SKIP LOCKED) r
            ) d
            WHERE c.n > 0
            ORDER BY c.ord
        LOOP
            runs := runs || share.ids;
            rest := rest - cardinality(share.ids);
            IF cardinality(share.ids) = share.n THEN
                fullest := fullest || share.tenant;
            END IF;
            IF pass = 1 THEN
                cursor_at := share.tenant;
            END IF;
        END LOOP;
        tenants := fullest;
    END LOOP;
    -- Every tenant visited and none with due rows left: nothing for the caller.
    IF rest > 0 AND walked AND cardinality(tenants) = 0 THEN
        rest := 0;
    END IF;
END
$$;
