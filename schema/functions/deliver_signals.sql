-- Deliver signals to executions of one tenant on this shard, in one transaction.
-- Each signal is stored, recorded in its run's history and wakes the run if it
-- waits on that name (a signal wait of that name, or a condition that handles
-- it); an update (a signal named shardq:update:*, see workflow/contracts.py)
-- wakes a parked run whatever it waits on. A refused signal (unknown run,
-- another tenant's, finished, a gate already taken, too many pending) inserts
-- nothing and comes back with its reason_code and detail, decided by
-- shardq.signal_refusal, which every sender's refusal goes through; a repeated
-- idempotency key returns the earlier signal's id and name, and so does a
-- repeated origin (the outbox row a relay delivers under: see the outbox relay
-- in outbox/). A run of a declarative workflow takes one signal per gate name
-- (its executions.gates): a second one is refused (`gate_closed`), the first
-- one stands. Rows come back one per input, `ord` numbering them from 1;
-- signal_id is set when this call stored the signal. A target whose bucket
-- this shard cannot write refuses the whole call (shardq.fence).
--
-- Bounds: at most p_max_pending unconsumed signals of one name per run, and
-- p_max_pending_total of all names: a flood of a name the run never waits on
-- fills its own bound, not the one of the name the run does wait on.
--
-- Senders lock in the workers' order: every task row first (a parked run has
-- none), then every executions row, each set in id order, so two batches, or a
-- batch and a worker's commit, never wait on each other in a cycle. The
-- executions rows are never written after a run starts; locking them
-- serializes senders to one run, so one run's signals commit in id order
-- (replay relies on it) and a cancel cannot slip between a sender's checks and
-- its insert. A batch with one signal per run (the usual one) is a single
-- set-based statement; one with several signals to a run is handled signal by
-- signal in input order, so a later signal sees an earlier one (pending
-- count, idempotency key, wake). `p_traces`: each signal's sender's trace
-- context (schema/0025), kept on the signal for the turn that consumes it.
CREATE OR REPLACE FUNCTION shardq.deliver_signals(
    p_tenant            text,
    p_ids               uuid[],
    p_names             text[],
    p_payloads          jsonb[],
    p_keys              text[],
    p_max_pending       integer,
    p_max_pending_total integer,
    p_origins           text[],
    p_traces            text[] DEFAULT NULL
) RETURNS TABLE (
    ord          integer,
    signal_id    bigint,
    earlier_id   bigint,
    earlier_name text,
    reason_code  text,
    detail       text,
    woken        bigint
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    i integer;
BEGIN
    -- Every target's bucket must be writable here, or nothing is delivered: the
    -- caller (client, relay) follows the refusal to the target's owner.
    PERFORM shardq.fence(p_ids);
    PERFORM shardq.lock_runs(p_ids, p_ids);

    -- Messages between parents and children (schema/0023) take their own path
    -- (deliver_control), under the locks just taken.
    IF EXISTS (SELECT 1 FROM unnest(p_names) AS n WHERE starts_with(n, 'shardq:run:')) THEN
        RETURN QUERY
        SELECT c.ord, c.signal_id, c.earlier_id, c.earlier_name, c.reason_code, c.detail,
               c.woken
        FROM shardq.deliver_control(p_tenant, p_ids, p_names, p_payloads, p_keys, p_origins,
                                    p_max_pending, p_max_pending_total) AS c;
        RETURN;
    END IF;

    IF cardinality(p_ids) = (SELECT count(DISTINCT u) FROM unnest(p_ids) AS u) THEN
        RETURN QUERY
        WITH item AS (
            SELECT i.ord::integer AS ord, i.id, i.name, i.payload, i.key, i.origin, i.trace,
                   x.tenant,
                   -- A gate takes one signal: is its name taken (consumed or not)?
                   CASE WHEN i.name = ANY(x.gates) THEN EXISTS (
                       SELECT 1 FROM shardq.signals s
                       WHERE s.execution_id = i.id AND s.name = i.name)
                   ELSE false END AS gate_closed,
                   (SELECT substr(o.kind, 5) FROM shardq.history o
                    WHERE o.execution_id = i.id AND o.kind IN (
                        'run.completed', 'run.failed', 'run.cancelled', 'run.timed_out'))
                   AS finished,
                   e.id AS earlier_id, e.name AS earlier_name,
                   (SELECT count(*) FROM shardq.signals s
                    WHERE s.execution_id = i.id AND s.consumed_at IS NULL AND s.name = i.name)
                   AS pending,
                   (SELECT count(*) FROM shardq.signals s
                    WHERE s.execution_id = i.id AND s.consumed_at IS NULL) AS pending_total
            -- unnest pads the shorter arrays with nulls: origins may be empty.
            FROM unnest(p_ids, p_names, p_payloads, p_keys, coalesce(p_origins, '{}'),
                        coalesce(p_traces, '{}'))
                 WITH ORDINALITY AS i(id, name, payload, key, origin, trace, ord)
            LEFT JOIN LATERAL (
                SELECT x.tenant, x.gates FROM shardq.executions x WHERE x.id = i.id OFFSET 0
            ) x ON true
            LEFT JOIN LATERAL (
                SELECT s.id, s.name FROM shardq.signals s
                WHERE s.execution_id = i.id AND s.idempotency_key = i.key
                UNION ALL
                -- Client signals have no origins: a one-time filter skips the probe.
                SELECT s.id, s.name FROM shardq.signals s
                WHERE p_origins IS NOT NULL AND s.execution_id = i.id AND s.origin = i.origin
                LIMIT 1
            ) e ON true
        ), judged AS (
            SELECT it.ord, it.id, it.name, it.payload, it.key, it.origin, it.trace, it.earlier_id,
                   it.earlier_name, r.reason_code, r.detail
            FROM item it
            CROSS JOIN LATERAL shardq.signal_refusal(
                it.id, p_tenant, it.name, p_max_pending, p_max_pending_total, it.tenant,
                it.finished, it.earlier_id, it.gate_closed, it.pending, it.pending_total) r
        ), inserted AS (
            INSERT INTO shardq.signals
                (execution_id, tenant, name, payload, idempotency_key, origin, trace)
            SELECT j.id, p_tenant, j.name, j.payload, j.key, j.origin, j.trace FROM judged j
            WHERE j.reason_code IS NULL AND j.earlier_id IS NULL
            ORDER BY j.ord
            RETURNING id, execution_id, name
        ), recorded AS (
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            SELECT n.execution_id, NULL, 'signal.received', n.name,
                   jsonb_build_object('signal_id', n.id)
            FROM inserted n
        ), woken AS (
            -- Due now if the run is parked on this name and no worker holds it.
            -- The task row is not the run's first: its claim reads history.
            INSERT INTO shardq.tasks AS cur (execution_id, run_at, claims, priority,
                                             concurrency_key, tenant, build_id)
            SELECT n.execution_id, now(), 1, e.priority, e.concurrency_key, e.tenant,
                   CASE WHEN e.pinned THEN e.build_id END
            FROM inserted n
            CROSS JOIN LATERAL (
                SELECT w.kind, w.name, w.request FROM shardq.waits w
                WHERE w.execution_id = n.execution_id OFFSET 0
            ) w
            JOIN shardq.executions e ON e.id = n.execution_id
            WHERE (w.kind = 'signal' AND w.name = n.name)
               OR (w.kind = 'condition' AND w.request->'signals' ? n.name)
               OR starts_with(n.name, 'shardq:update:')
            ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
            WHERE cur.lease_token IS NULL
            RETURNING cur.execution_id, cur.priority
        )
        SELECT j.ord, n.id, j.earlier_id, j.earlier_name, j.reason_code, j.detail,
               -- A hint: one per transaction however many runs woke.
               (SELECT count(pg_notify(shardq.wake_channel(), shardq.wake_note(w.priority)))
                FROM woken w)
        FROM judged j LEFT JOIN inserted n ON n.execution_id = j.id
        ORDER BY j.ord;
        RETURN;
    END IF;

    FOR i IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        RETURN QUERY
        WITH target AS (
            SELECT x.id, x.tenant,
                   CASE WHEN p_names[i] = ANY(x.gates) THEN EXISTS (
                       SELECT 1 FROM shardq.signals s
                       WHERE s.execution_id = x.id AND s.name = p_names[i])
                   ELSE false END AS gate_closed,
                   (SELECT substr(o.kind, 5) FROM shardq.history o
                    WHERE o.execution_id = x.id AND o.kind IN (
                        'run.completed', 'run.failed', 'run.cancelled', 'run.timed_out'))
                   AS finished
            FROM shardq.executions x WHERE x.id = p_ids[i]
        ), earlier AS (
            SELECT s.id, s.name FROM shardq.signals s
            WHERE s.execution_id = p_ids[i] AND s.idempotency_key = p_keys[i]
            UNION ALL
            SELECT s.id, s.name FROM shardq.signals s
            WHERE p_origins IS NOT NULL AND s.execution_id = p_ids[i]
              AND s.origin = p_origins[i]
            LIMIT 1
        ), pending AS (
            SELECT count(*) FILTER (WHERE s.name = p_names[i]) AS n, count(*) AS total
            FROM shardq.signals s
            WHERE s.execution_id = p_ids[i] AND s.consumed_at IS NULL
        ), judged AS (
            SELECT (SELECT e.id FROM earlier e) AS earlier_id,
                   (SELECT e.name FROM earlier e) AS earlier_name, r.reason_code, r.detail
            FROM shardq.signal_refusal(
                p_ids[i], p_tenant, p_names[i], p_max_pending, p_max_pending_total,
                (SELECT t.tenant FROM target t), (SELECT t.finished FROM target t),
                (SELECT e.id FROM earlier e),
                coalesce((SELECT t.gate_closed FROM target t), false),
                (SELECT p.n FROM pending p), (SELECT p.total FROM pending p)) r
        ), admitted AS (
            SELECT t.id FROM target t, judged j
            WHERE j.reason_code IS NULL AND j.earlier_id IS NULL
        ), inserted AS (
            INSERT INTO shardq.signals
                (execution_id, tenant, name, payload, idempotency_key, origin, trace)
            SELECT a.id, p_tenant, p_names[i], p_payloads[i], p_keys[i], p_origins[i],
                   p_traces[i]
            FROM admitted a
            RETURNING id, execution_id
        ), recorded AS (
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            SELECT n.execution_id, NULL, 'signal.received', p_names[i],
                   jsonb_build_object('signal_id', n.id)
            FROM inserted n
        ), woken AS (
            -- Due now if the run is parked on this name and no worker holds it.
            INSERT INTO shardq.tasks AS cur (execution_id, run_at, claims, priority,
                                             concurrency_key, tenant, build_id)
            SELECT w.execution_id, now(), 1, e.priority, e.concurrency_key, e.tenant,
                   CASE WHEN e.pinned THEN e.build_id END
            FROM shardq.waits w JOIN inserted n ON n.execution_id = w.execution_id
            JOIN shardq.executions e ON e.id = w.execution_id
            WHERE (w.kind = 'signal' AND w.name = p_names[i])
               OR (w.kind = 'condition' AND w.request->'signals' ? p_names[i])
               OR starts_with(p_names[i], 'shardq:update:')
            ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
            WHERE cur.lease_token IS NULL
            RETURNING cur.execution_id, cur.priority
        )
        SELECT i, (SELECT n.id FROM inserted n), j.earlier_id, j.earlier_name, j.reason_code,
               j.detail,
               -- A hint, collapsed by the server into one per transaction.
               (SELECT count(pg_notify(shardq.wake_channel(), shardq.wake_note(w.priority)))
                FROM woken w)
        FROM judged j;
    END LOOP;
END
$$;

