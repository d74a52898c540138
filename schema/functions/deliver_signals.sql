-- Deliver signals to executions of one tenant on this shard, in one transaction.
-- Each signal is stored, recorded in its run's history and wakes the run if it
-- waits on that name. Refusals (unknown run, another tenant's, finished, too many
-- pending) insert nothing and come back as a row the caller reads the reason
-- from; a repeated idempotency key returns the earlier signal's id. Rows come
-- back one per input, `ord` numbering them from 1.
--
-- Senders lock in the workers' order: every task row first (a parked run has
-- none), then every executions row, each set in id order, so two batches, or a
-- batch and a worker's commit, never wait on each other in a cycle. A batch
-- with one signal per run (the usual one) is then a single set-based statement;
-- one with several signals to a run is handled signal by signal in input order,
-- so a later signal sees an earlier one (pending count, idempotency key, wake).
CREATE OR REPLACE FUNCTION shardq.deliver_signals(
    p_tenant      text,
    p_ids         uuid[],
    p_names       text[],
    p_payloads    jsonb[],
    p_keys        text[],
    p_max_pending integer
) RETURNS TABLE (
    ord        integer,
    state      text,
    tenant     text,
    earlier_id bigint,
    pending    bigint,
    signal_id  bigint,
    woken      bigint
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    i integer;
BEGIN
    PERFORM 1 FROM shardq.tasks t WHERE t.execution_id = ANY(p_ids)
    ORDER BY t.execution_id FOR UPDATE;
    PERFORM 1 FROM shardq.executions x WHERE x.id = ANY(p_ids)
    ORDER BY x.id FOR UPDATE;

    IF cardinality(p_ids) = (SELECT count(DISTINCT u) FROM unnest(p_ids) AS u) THEN
        RETURN QUERY
        WITH item AS (
            SELECT i.ord::integer AS ord, i.id, i.name, i.payload, i.key, x.state, x.tenant,
                   (SELECT s.id FROM shardq.signals s
                    WHERE s.execution_id = i.id AND s.idempotency_key = i.key) AS earlier_id,
                   (SELECT count(*) FROM shardq.signals s
                    WHERE s.execution_id = i.id AND s.consumed_at IS NULL) AS pending
            FROM unnest(p_ids, p_names, p_payloads, p_keys)
                 WITH ORDINALITY AS i(id, name, payload, key, ord)
            LEFT JOIN LATERAL (
                SELECT e.state, e.tenant FROM shardq.executions e WHERE e.id = i.id OFFSET 0
            ) x ON true
        ), inserted AS (
            INSERT INTO shardq.signals (execution_id, tenant, name, payload, idempotency_key)
            SELECT it.id, p_tenant, it.name, it.payload, it.key FROM item it
            WHERE it.tenant = p_tenant
              AND it.state NOT IN ('completed', 'failed', 'cancelled', 'timed_out')
              AND it.earlier_id IS NULL
              AND it.pending < p_max_pending
            ORDER BY it.ord
            RETURNING id, execution_id, name
        ), recorded AS (
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            SELECT n.execution_id, NULL, 'signal.received', n.name,
                   jsonb_build_object('signal_id', n.id)
            FROM inserted n
        ), woken AS (
            -- Due now if the run is parked on this name and no worker holds it.
            INSERT INTO shardq.tasks AS cur (execution_id, run_at)
            SELECT n.execution_id, now()
            FROM inserted n
            CROSS JOIN LATERAL (
                SELECT w.kind, w.name FROM shardq.waits w
                WHERE w.execution_id = n.execution_id OFFSET 0
            ) w
            WHERE w.kind = 'signal' AND w.name = n.name
            ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
            WHERE cur.lease_token IS NULL
            RETURNING cur.execution_id
        )
        SELECT it.ord, it.state, it.tenant, it.earlier_id, it.pending, n.id,
               -- A hint: one per transaction however many runs woke.
               (SELECT count(pg_notify(shardq.wake_channel(), '')) FROM woken)
        FROM item it LEFT JOIN inserted n ON n.execution_id = it.id
        ORDER BY it.ord;
        RETURN;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        RETURN QUERY
        WITH target AS (
            SELECT x.id, x.state, x.tenant FROM shardq.executions x WHERE x.id = p_ids[i]
        ), earlier AS (
            SELECT s.id FROM shardq.signals s
            WHERE s.execution_id = p_ids[i] AND s.idempotency_key = p_keys[i]
        ), pending AS (
            SELECT count(*) AS n FROM shardq.signals s
            WHERE s.execution_id = p_ids[i] AND s.consumed_at IS NULL
        ), admitted AS (
            SELECT t.id FROM target t
            WHERE t.tenant = p_tenant
              AND t.state NOT IN ('completed', 'failed', 'cancelled', 'timed_out')
              AND NOT EXISTS (SELECT 1 FROM earlier)
              AND (SELECT n FROM pending) < p_max_pending
        ), inserted AS (
            INSERT INTO shardq.signals (execution_id, tenant, name, payload, idempotency_key)
            SELECT a.id, p_tenant, p_names[i], p_payloads[i], p_keys[i] FROM admitted a
            RETURNING id, execution_id
        ), recorded AS (
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            SELECT n.execution_id, NULL, 'signal.received', p_names[i],
                   jsonb_build_object('signal_id', n.id)
            FROM inserted n
        ), woken AS (
            -- Due now if the run is parked on this name and no worker holds it.
            INSERT INTO shardq.tasks AS cur (execution_id, run_at)
            SELECT w.execution_id, now()
            FROM shardq.waits w JOIN inserted n ON n.execution_id = w.execution_id
            WHERE w.kind = 'signal' AND w.name = p_names[i]
            ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
            WHERE cur.lease_token IS NULL
            RETURNING cur.execution_id
        )
        SELECT
            i,
            (SELECT t.state FROM target t),
            (SELECT t.tenant FROM target t),
            (SELECT e.id FROM earlier e),
            (SELECT p.n FROM pending p),
            (SELECT n.id FROM inserted n),
            -- A hint, collapsed by the server into one per transaction.
            (SELECT count(pg_notify(shardq.wake_channel(), '')) FROM woken);
    END LOOP;
END
$$;
