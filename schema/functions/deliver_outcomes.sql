-- Children's outcomes to their parents (schema/0023), as one set: deliver_control
-- hands over every `shardq:run:child` message of a relay's batch at once, and
-- runs_ended those of a worker's commit, the parents' rows locked by the caller.
-- Each outcome is buffered for its parent (no history event: the parent's wait
-- records what it takes), its children row marked ended, and each parent's wait
-- for children counted down by the outcomes it got, the parent due once it
-- reaches 0: one update and at most one wake per parent, however many children
-- ended; each parent is read once too. An outcome whose key landed before
-- answers the earlier signal; one for a parent that ended first (an abandoned
-- child), or no longer lists the child, is dropped, answered as delivered; only
-- a parent that is not there (another tenant's counts as none) refuses it. One
-- statement: its rows must not repeat a key (a child ends once, and sends one
-- outcome).
--
-- A repeat is found by the insert's own conflict on signals_idempotency, not by
-- a lookup per outcome beforehand: with statistics taken before a burst (a
-- truncated or quiet table) the planner answered that lookup from signals_pkey,
-- reading every signal the parent holds for each outcome, quadratic in a
-- fan-in (10,000 children: 0.4-0.6 s a batch of outcomes). The earlier signal is
-- read only for the outcomes that conflicted, and marking a children row again
-- with the state it has is harmless.
CREATE OR REPLACE FUNCTION shardq.deliver_outcomes(
    p_tenant text, p_ids uuid[], p_payloads jsonb[], p_keys text[], p_origins text[])
RETURNS TABLE (ord integer, signal_id bigint, earlier_id bigint, reason_code text,
               detail text, woken bigint)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH arg AS (
        SELECT i.ord::integer AS ord, i.id, i.payload, i.key, i.origin
        FROM unnest(p_ids, p_payloads, p_keys, coalesce(p_origins, '{}'))
             WITH ORDINALITY AS i(id, payload, key, origin, ord)
    ), parent AS (
        -- Each parent read once, however many of its children's outcomes the batch holds.
        SELECT p.id, x.tenant AS run_tenant,
               EXISTS (SELECT 1 FROM shardq.history o WHERE o.execution_id = p.id AND o.kind IN (
                   'run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')) AS finished
        FROM (SELECT DISTINCT a.id FROM arg a) p
        LEFT JOIN LATERAL (
            SELECT x.tenant FROM shardq.executions x WHERE x.id = p.id OFFSET 0
        ) x ON true
    ), item AS (
        SELECT a.*, p.run_tenant, p.finished FROM arg a JOIN parent p ON p.id = a.id
    ), fresh AS (
        -- Only a child the parent lists: its list is gone once the parent ended and
        -- was purged, or continued as new (a new generation starts none of them).
        -- Found by the update that marks it ended: one probe a child.
        UPDATE shardq.children c SET ended = i.payload->>'state'
        FROM item i
        WHERE i.run_tenant = p_tenant
          AND c.parent_id = i.id AND c.child_id = (i.payload->>'child')::uuid
        RETURNING i.ord, i.id, i.key, i.payload, i.origin, i.finished
    ), inserted AS (
        INSERT INTO shardq.signals (execution_id, tenant, name, payload, idempotency_key, origin)
        SELECT f.id, p_tenant, 'shardq:run:child', f.payload, f.key, f.origin
        FROM fresh f WHERE NOT f.finished ORDER BY f.ord
        ON CONFLICT (execution_id, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO NOTHING
        RETURNING id, execution_id, idempotency_key
    ), counted AS (
        UPDATE shardq.waits w
        SET request = jsonb_set(w.request, '{need}',
                                to_jsonb((w.request->>'need')::integer - n.got))
        FROM (SELECT n.execution_id, count(*) AS got FROM inserted n GROUP BY 1) n
        WHERE w.execution_id = n.execution_id AND w.kind = 'children'
        RETURNING w.execution_id, (w.request->>'need')::integer AS need  -- as counted down
    ), woken AS (
        -- Due now if no worker holds it; a leased parent counts what arrived
        -- when its turn parks (commit_turns_v2).
        INSERT INTO shardq.tasks AS cur (execution_id, run_at, claims, priority,
                                         concurrency_key, tenant, build_id)
        SELECT e.id, now(), 1, e.priority, e.concurrency_key, e.tenant,
               CASE WHEN e.pinned THEN e.build_id END
        FROM counted c JOIN shardq.executions e ON e.id = c.execution_id
        WHERE c.need <= 0
        ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
        WHERE cur.lease_token IS NULL
        RETURNING cur.priority
    )
    SELECT i.ord, n.id,
           CASE WHEN n.id IS NULL AND i.run_tenant = p_tenant THEN (
               SELECT s.id FROM shardq.signals s
               WHERE s.execution_id = i.id AND s.idempotency_key = i.key) END,
           CASE WHEN i.run_tenant IS DISTINCT FROM p_tenant THEN 'target_not_found' END,
           CASE WHEN i.run_tenant IS DISTINCT FROM p_tenant
                THEN format('execution %s not found', i.id) END,
           (SELECT count(pg_notify(shardq.wake_channel(), shardq.wake_note(w.priority)))
            FROM woken w)
    FROM item i
    LEFT JOIN inserted n ON n.execution_id = i.id AND n.idempotency_key = i.key
    ORDER BY i.ord;
END
$$;
