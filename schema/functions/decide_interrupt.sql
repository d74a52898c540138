-- A person's decision on a run's open interrupt, in one transaction.
--
-- The caller (Client.decide) has already checked the payload against the
-- interrupt's schema, read at p_position; a decision for an interrupt that is
-- no longer the one open there is refused as `not_open`.
--
-- Rules, in order:
-- - another tenant's run, or none: `not_found`, and nothing is written;
-- - the same decision id again: `repeated`, answered with what it decided
--   (a retried request is a no-op success), or `decision_id_reused` when that
--   id decided another interrupt;
-- - no open interrupt of that name: `decided` (another decision stands; it is
--   returned), `timed_out`, or `not_open`;
-- - past its deadline (the timeout turn may be about to record it):
--   `timed_out`, so a late click is never an approval. Both sides are the
--   database's clock: the deadline written when the run parked, and this
--   decision's arrival, read once the run's locks are held (a decision that
--   waited for them behind the commit recording the timeout arrives after
--   it). A decision in time stands however late a worker comes, and a
--   worker's timeout is not granted over it (defer_premature_timeouts);
-- - an action the interrupt does not accept: `action_refused`;
-- - otherwise `accepted`: the decision is recorded at the interrupt's
--   position (replay returns it), the wait is closed and the run made due.
-- Every refusal for a live run of the caller's tenant is recorded as an
-- `interrupt.refused` event: the audit trail has each attempt. A finished
-- run's history ends with its outcome: a refusal there is answered and
-- stores nothing (it could change nothing, and would let any caller grow a
-- closed record without limit).
--
-- Locks: the run's task row, then its executions row (the senders' and the
-- workers' order), so concurrent decisions for one run are serialized and
-- exactly one wins.
CREATE OR REPLACE FUNCTION shardq.decide_interrupt(
    p_tenant      text,
    p_id          uuid,
    p_name        text,
    p_position    integer,
    p_action      text,
    p_payload     jsonb,
    p_decision_id text,
    p_actor       text
) RETURNS TABLE (outcome text, decision jsonb, detail text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    run_tenant text;
    w          record;
    earlier    record;
    refusal    text;
    why        text;
    standing   jsonb;
    finished   text;
    arrived    timestamptz;
    woken_priority smallint;
BEGIN
    PERFORM shardq.fence(ARRAY[p_id]);  -- a run of a bucket moved or moving is decided there
    PERFORM 1 FROM shardq.tasks t WHERE t.execution_id = p_id FOR UPDATE;
    SELECT x.tenant INTO run_tenant FROM shardq.executions x WHERE x.id = p_id FOR UPDATE;
    arrived := clock_timestamp();
    IF run_tenant IS DISTINCT FROM p_tenant THEN
        RETURN QUERY SELECT 'not_found'::text, NULL::jsonb, NULL::text;
        RETURN;
    END IF;

    SELECT h.name, h.payload INTO earlier FROM shardq.history h
    WHERE h.execution_id = p_id AND h.kind = 'interrupt.decided'
      AND h.payload->>'decision_id' = p_decision_id
    LIMIT 1;
    IF FOUND AND earlier.name = p_name THEN
        RETURN QUERY SELECT 'repeated'::text, earlier.payload, NULL::text;
        RETURN;
    ELSIF FOUND THEN
        refusal := 'decision_id_reused';
        why := format('decision id %s decided interrupt %s', p_decision_id, earlier.name);
    ELSE
        SELECT wt.position, wt.deadline, wt.request INTO w FROM shardq.waits wt
        WHERE wt.execution_id = p_id AND wt.kind = 'interrupt' AND wt.name = p_name;
        IF NOT FOUND THEN
            SELECT h.payload INTO standing FROM shardq.history h
            WHERE h.execution_id = p_id AND h.name = p_name
              AND h.kind IN ('interrupt.decided', 'interrupt.timed_out')
            ORDER BY h.seq DESC LIMIT 1;
            refusal := CASE WHEN standing IS NULL THEN 'not_open'
                            WHEN standing->>'action' = 'timed_out' THEN 'timed_out'
                            ELSE 'decided' END;
            why := CASE refusal
                WHEN 'not_open' THEN format('the run waits for no interrupt %s', p_name)
                WHEN 'timed_out' THEN format('interrupt %s timed out', p_name)
                ELSE format('interrupt %s was decided already: %s by %s', p_name,
                            standing->>'action', coalesce(standing->>'actor', 'nobody')) END;
        ELSIF p_position IS NULL OR w.position <> p_position THEN
            refusal := 'not_open';
            why := format('interrupt %s changed while the decision was made; read it again',
                          p_name);
        ELSIF w.deadline IS NOT NULL AND w.deadline < arrived THEN
            refusal := 'timed_out';
            why := format('interrupt %s timed out at %s', p_name, w.deadline);
        ELSIF NOT coalesce(w.request->'actions' ? p_action, false) THEN
            refusal := 'action_refused';
            why := format('interrupt %s accepts %s, not %s', p_name,
                          w.request->'actions', p_action);
        END IF;
    END IF;

    IF refusal IS NOT NULL THEN
        SELECT substr(o.kind, 5) INTO finished FROM shardq.history o
        WHERE o.execution_id = p_id
          AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out');
        IF finished IS NOT NULL THEN
            why := format('%s (the run is %s)', why, finished);
        ELSE
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            VALUES (p_id, NULL, 'interrupt.refused', p_name, jsonb_build_object(
                'action', p_action, 'decision_id', p_decision_id, 'actor', p_actor,
                'reason_code', refusal, 'detail', why, 'attempted_at', arrived));
        END IF;
        RETURN QUERY SELECT refusal, standing, why;
        RETURN;
    END IF;

    standing := jsonb_build_object('action', p_action, 'payload', p_payload,
                                   'decision_id', p_decision_id, 'actor', p_actor,
                                   'decided_at', arrived);
    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    VALUES (p_id, w.position, 'interrupt.decided', p_name, standing);
    DELETE FROM shardq.waits wt WHERE wt.execution_id = p_id;
    -- Due now; the row is not the run's first, so its claim reads history.
    INSERT INTO shardq.tasks AS cur (execution_id, run_at, claims, priority, concurrency_key,
                                     tenant, build_id)
    SELECT p_id, now(), 1, e.priority, e.concurrency_key, e.tenant,
           CASE WHEN e.pinned THEN e.build_id END
    FROM shardq.executions e WHERE e.id = p_id
    ON CONFLICT (execution_id) DO UPDATE SET run_at = now() WHERE cur.lease_token IS NULL
    RETURNING cur.priority INTO woken_priority;
    -- None when the run waits for a slot of its key (shardq.admit_task queued it).
    IF woken_priority IS NOT NULL THEN
        PERFORM pg_notify(shardq.wake_channel(), shardq.wake_note(woken_priority));
    END IF;
    RETURN QUERY SELECT 'accepted'::text, standing, NULL::text;
END
$$;
