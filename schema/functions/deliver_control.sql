-- The messages between parents and children (schema/0023) among a delivery,
-- as deliver_signals hands them over: after that function fenced and locked
-- every receiver's rows, so this runs under the locks every sender takes. The
-- answer has deliver_signals' rows, one per input in input order. A message
-- acted on, or dropped because it no longer matters, answers all NULLs
-- (delivered, to the relay); a repeated outcome answers its earlier signal; only
-- an outcome for a parent that is not there is refused. Signals of other names
-- in the same delivery (the relay batches a tenant's rows to a shard) go back
-- to deliver_signals one by one.
--   shardq:run:start   p_payloads[i] is a child's start: all of a delivery's in
--                      one start_child_runs call; a workflow key another run
--                      holds sends the parent the child's failure instead.
--   shardq:run:child   a child's outcome: all of them as one set
--                      (deliver_outcomes).
--   shardq:run:cancel  cancel the child: at once when no worker holds it, else
--                      at its worker's next commit. A finished child keeps its
--                      outcome.
CREATE OR REPLACE FUNCTION shardq.deliver_control(
    p_tenant text, p_ids uuid[], p_names text[], p_payloads jsonb[], p_keys text[],
    p_origins text[], p_max_pending integer, p_max_pending_total integer)
RETURNS TABLE (ord integer, signal_id bigint, earlier_id bigint, earlier_name text,
               reason_code text, detail text, woken bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    n          integer := cardinality(p_ids);
    r_sid      bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    r_earlier  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    r_ename    text[] := array_fill(NULL::text, ARRAY[n]);
    r_reason   text[] := array_fill(NULL::text, ARRAY[n]);
    r_detail   text[] := array_fill(NULL::text, ARRAY[n]);
    r_woken    bigint[] := array_fill(0::bigint, ARRAY[n]);
    picked     integer[];
    docs       jsonb;
    r          record;
    i          integer;
BEGIN
    -- Starts, as one set.
    SELECT array_agg(x.o ORDER BY x.o), jsonb_agg(p_payloads[x.o] ORDER BY x.o)
    INTO picked, docs
    FROM generate_subscripts(p_ids, 1) AS x(o) WHERE p_names[x.o] = 'shardq:run:start';
    IF picked IS NOT NULL THEN
        PERFORM shardq.start_child_runs(docs);
    END IF;

    -- Outcomes, as one set.
    SELECT array_agg(x.o ORDER BY x.o) INTO picked
    FROM generate_subscripts(p_ids, 1) AS x(o) WHERE p_names[x.o] = 'shardq:run:child';
    IF picked IS NOT NULL THEN
        FOR r IN
            SELECT d.* FROM shardq.deliver_outcomes(
                p_tenant,
                ARRAY(SELECT p_ids[k] FROM unnest(picked) WITH ORDINALITY AS u(k, j) ORDER BY j),
                ARRAY(SELECT p_payloads[k] FROM unnest(picked) WITH ORDINALITY AS u(k, j)
                      ORDER BY j),
                ARRAY(SELECT p_keys[k] FROM unnest(picked) WITH ORDINALITY AS u(k, j) ORDER BY j),
                CASE WHEN p_origins IS NOT NULL THEN ARRAY(
                    SELECT p_origins[k] FROM unnest(picked) WITH ORDINALITY AS u(k, j)
                    ORDER BY j) END) AS d
        LOOP
            i := picked[r.ord];
            r_sid[i] := r.signal_id;
            r_earlier[i] := r.earlier_id;
            r_ename[i] := CASE WHEN r.earlier_id IS NOT NULL THEN 'shardq:run:child' END;
            r_reason[i] := r.reason_code;
            r_detail[i] := r.detail;
            r_woken[i] := r.woken;
        END LOOP;
    END IF;

    FOR i IN 1 .. n LOOP
        IF p_names[i] = 'shardq:run:cancel' THEN
            IF EXISTS (SELECT 1 FROM shardq.executions x WHERE x.id = p_ids[i]
                       AND x.tenant = p_tenant)
               AND NOT EXISTS (SELECT 1 FROM shardq.history o
                               WHERE o.execution_id = p_ids[i] AND o.kind IN (
                                   'run.completed', 'run.failed', 'run.cancelled',
                                   'run.timed_out')) THEN
                IF EXISTS (SELECT 1 FROM shardq.tasks t
                           WHERE t.execution_id = p_ids[i] AND t.leased_until > now()) THEN
                    UPDATE shardq.tasks SET cancel_requested = true
                    WHERE execution_id = p_ids[i];
                ELSE
                    PERFORM shardq.cancel_run(p_ids[i], 'parent ' || (p_payloads[i]->>'parent'));
                END IF;
            END IF;
        ELSIF NOT starts_with(p_names[i], 'shardq:run:') THEN
            SELECT d.signal_id, d.earlier_id, d.earlier_name, d.reason_code, d.detail, d.woken
            INTO r_sid[i], r_earlier[i], r_ename[i], r_reason[i], r_detail[i], r_woken[i]
            FROM shardq.deliver_signals(
                p_tenant, ARRAY[p_ids[i]], ARRAY[p_names[i]], ARRAY[p_payloads[i]],
                ARRAY[p_keys[i]], p_max_pending, p_max_pending_total,
                CASE WHEN p_origins IS NOT NULL THEN ARRAY[p_origins[i]] END) AS d;
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT x.o, r_sid[x.o], r_earlier[x.o], r_ename[x.o], r_reason[x.o], r_detail[x.o],
           r_woken[x.o]
    FROM generate_series(1, n) AS x(o) ORDER BY x.o;
END
$$;
