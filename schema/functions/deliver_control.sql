-- One message between a parent and its child (schema/0023), as deliver_signals
-- hands it over: after that function fenced and locked the receiver's rows, so
-- this runs under the locks every sender takes. Its answer has
-- deliver_signals' columns: a message acted on, or dropped because it no
-- longer matters, answers all NULLs (delivered, to the relay); a repeat of a
-- child's outcome answers its earlier signal; only an outcome for a parent
-- that is not there (another tenant's id counts as none) is refused.
--   shardq:run:start   p_payload is the child's start (start_child_runs); a
--                      workflow key another run holds sends the parent the
--                      child's failure instead.
--   shardq:run:child   the child's outcome, buffered for the parent's wait
--                      (no history event: the wait records what it takes),
--                      its children row marked ended, and the parent's wait
--                      for children one outcome nearer: at 0 it is due.
--   shardq:run:cancel  cancel the child: at once when no worker holds it,
--                      else at its worker's next commit. A finished child
--                      keeps its outcome.
CREATE OR REPLACE FUNCTION shardq.deliver_control(
    p_tenant text, p_id uuid, p_name text, p_payload jsonb, p_key text, p_origin text)
RETURNS TABLE (signal_id bigint, earlier_id bigint, earlier_name text, reason_code text,
               detail text, woken bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    run_tenant text;
    finished   boolean;
    refused    text;
    parent     uuid;
    sid        bigint;
    need       integer;
    woke       bigint := 0;
BEGIN
    IF p_name = 'shardq:run:start' THEN
        SELECT s.refusal, s.parent INTO refused, parent
        FROM shardq.start_child_runs(jsonb_build_array(p_payload)) s;
        IF refused IS NOT NULL THEN
            IF shardq.send_control(
                p_id, -1, parent, p_tenant, 'shardq:run:child',
                jsonb_build_object('child', p_id, 'workflow', p_payload->'workflow',
                                   'workflow_id', p_payload->'workflow_id', 'state', 'failed',
                                   'error', jsonb_build_object('type', 'ChildStartRefused',
                                                               'message', refused)),
                'child:' || p_id, true)
            THEN
                PERFORM pg_notify(shardq.outbox_channel(), '');
            END IF;
        END IF;
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::text, 0::bigint;
        RETURN;
    END IF;

    SELECT x.tenant, EXISTS (
               SELECT 1 FROM shardq.history o WHERE o.execution_id = x.id AND o.kind IN (
                   'run.completed', 'run.failed', 'run.cancelled', 'run.timed_out'))
    INTO run_tenant, finished
    FROM shardq.executions x WHERE x.id = p_id;

    IF p_name = 'shardq:run:cancel' THEN
        IF run_tenant IS NOT DISTINCT FROM p_tenant AND NOT finished THEN
            IF EXISTS (SELECT 1 FROM shardq.tasks t
                       WHERE t.execution_id = p_id AND t.leased_until > now()) THEN
                UPDATE shardq.tasks SET cancel_requested = true WHERE execution_id = p_id;
            ELSE
                PERFORM shardq.cancel_run(p_id, 'parent ' || (p_payload->>'parent'));
            END IF;
        END IF;
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::text, 0::bigint;
        RETURN;
    END IF;

    -- shardq:run:child
    IF run_tenant IS DISTINCT FROM p_tenant THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::text, 'target_not_found'::text,
                            format('execution %s not found', p_id), 0::bigint;
        RETURN;
    END IF;
    SELECT s.id INTO sid FROM shardq.signals s
    WHERE s.execution_id = p_id AND s.idempotency_key = p_key;
    IF sid IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, sid, p_name, NULL::text, NULL::text, 0::bigint;
        RETURN;
    END IF;
    UPDATE shardq.children c SET ended = p_payload->>'state'
    WHERE c.parent_id = p_id AND c.child_id = (p_payload->>'child')::uuid;
    IF finished THEN
        -- The parent ended first (an abandoned child): nothing waits for this.
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::text, 0::bigint;
        RETURN;
    END IF;
    INSERT INTO shardq.signals (execution_id, tenant, name, payload, idempotency_key, origin)
    VALUES (p_id, p_tenant, p_name, p_payload, p_key, p_origin)
    RETURNING id INTO sid;
    UPDATE shardq.waits w
    SET request = jsonb_set(w.request, '{need}', to_jsonb((w.request->>'need')::integer - 1))
    WHERE w.execution_id = p_id AND w.kind = 'children'
    RETURNING (w.request->>'need')::integer INTO need;
    IF need IS NOT NULL AND need <= 0 THEN
        WITH woken AS (
            INSERT INTO shardq.tasks AS cur (execution_id, run_at, claims, priority,
                                             concurrency_key, tenant)
            SELECT e.id, now(), 1, e.priority, e.concurrency_key, e.tenant
            FROM shardq.executions e WHERE e.id = p_id
            ON CONFLICT (execution_id) DO UPDATE SET run_at = now()
            WHERE cur.lease_token IS NULL
            RETURNING cur.priority
        )
        SELECT count(pg_notify(shardq.wake_channel(), shardq.wake_note(w.priority)))
        INTO woke FROM woken w;
    END IF;
    RETURN QUERY SELECT sid, NULL::bigint, NULL::text, NULL::text, NULL::text, woke;
END
$$;
