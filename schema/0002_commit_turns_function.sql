-- A commit batch as one statement: shardq.commit_turns().
--
-- The worker's group commit used to send a fence statement and a handful of
-- writes as a psycopg pipeline; profiling showed the client-side pipeline
-- machinery costing more than the statements. As a function the batch is one
-- round trip and one statement, while each statement inside still takes a
-- fresh snapshot (READ COMMITTED, volatile function): the writes after the
-- fence see what a signal sender committed while the fence waited for its
-- locks, which is what keeps a parking run from missing a signal.
--
-- Arrays come per kind of write; `c_*` arrays are one entry per commit, the
-- others one entry per event, wait, consumed signal or parking run. Rows are
-- found with `= ANY(array)` first (index probes), never by joining unnest()
-- to a table (the planner hash-joins that over a sequential scan).

CREATE FUNCTION shardq.commit_turns(
    lease_s         float8,
    c_ids           uuid[],
    c_tokens        uuid[],
    c_next          uuid[],
    c_states        text[],
    c_outputs       jsonb[],
    c_errors        jsonb[],
    c_actions       text[],
    c_delays        float8[],
    c_close_wait    boolean[],
    e_ids           uuid[],
    e_positions     integer[],
    e_kinds         text[],
    e_names         text[],
    e_payloads      jsonb[],
    e_wake_ins      float8[],
    w_ids           uuid[],
    w_positions     integer[],
    w_kinds         text[],
    w_names         text[],
    w_deadline_ins  float8[],
    w_requests      jsonb[],
    s_ids           bigint[],
    s_positions     integer[],
    p_ids           uuid[],
    p_names         text[]
) RETURNS TABLE (id uuid, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    fenced uuid[];
BEGIN
    -- Lock the task rows still leased with each commit's token, in id order so
    -- two batches never deadlock; stamp and update their executions.
    WITH req AS (
        SELECT * FROM unnest(c_ids, c_tokens, c_next, c_states, c_outputs, c_errors)
            AS r(id, token, next, state, output, error)
    ), locked AS (
        SELECT t.execution_id
        FROM shardq.tasks t
        WHERE t.execution_id = ANY(c_ids)
          AND (t.execution_id, t.lease_token) IN (SELECT r.id, r.token FROM req r)
        ORDER BY t.execution_id
        FOR UPDATE OF t
    ), updated AS (
        UPDATE shardq.executions x
        SET commit_token = r.next,
            state = coalesce(r.state, x.state),
            output = coalesce(r.output, x.output),
            error = coalesce(r.error, x.error),
            updated_at = now(),
            finished_at = CASE WHEN r.state IN ('completed', 'failed', 'cancelled', 'timed_out')
                               THEN now() ELSE x.finished_at END
        FROM req r JOIN locked l ON l.execution_id = r.id
        WHERE x.id = r.id AND x.id = ANY(c_ids)
        RETURNING x.id, x.cancel_requested
    )
    SELECT coalesce(array_agg(u.id), '{}') INTO fenced FROM updated u;

    IF cardinality(fenced) = 0 THEN
        RETURN;
    END IF;

    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    SELECT e.execution_id, e.position, e.kind, e.name,
           CASE WHEN e.wake_in IS NULL THEN e.payload
                ELSE e.payload
                     || jsonb_build_object('wake_at', now() + make_interval(secs => e.wake_in))
           END
    FROM unnest(e_ids, e_positions, e_kinds, e_names, e_payloads, e_wake_ins)
         WITH ORDINALITY AS e(execution_id, position, kind, name, payload, wake_in, ord)
    WHERE e.execution_id = ANY(fenced)
    ORDER BY e.ord;

    DELETE FROM shardq.waits w
    USING unnest(c_ids, c_close_wait) AS c(id, close)
    WHERE w.execution_id = ANY(fenced) AND w.execution_id = c.id AND c.close
      AND NOT w.execution_id = ANY(w_ids);

    INSERT INTO shardq.waits AS cur (execution_id, position, kind, name, deadline, request)
    SELECT w.id, w.position, w.kind, w.name, now() + make_interval(secs => w.deadline_in),
           w.request
    FROM unnest(w_ids, w_positions, w_kinds, w_names, w_deadline_ins, w_requests)
         AS w(id, position, kind, name, deadline_in, request)
    WHERE w.id = ANY(fenced)
    ON CONFLICT (execution_id) DO UPDATE
    SET position = excluded.position, kind = excluded.kind, name = excluded.name,
        deadline = excluded.deadline, request = excluded.request;

    UPDATE shardq.signals s
    SET consumed_at = now(), consumed_position = c.position
    FROM unnest(s_ids, s_positions) AS c(id, position)
    WHERE s.id = ANY(s_ids) AND s.id = c.id AND s.consumed_at IS NULL
      AND s.execution_id = ANY(fenced);

    -- Task rows last: until here they carry the lease token the fence matched.
    DELETE FROM shardq.tasks t
    USING unnest(c_ids, c_actions) AS c(id, action)
    WHERE t.execution_id = ANY(fenced) AND t.execution_id = c.id AND c.action = 'delete';

    -- A checkpoint rotates the token and leaves run_at (the lease expiry) to
    -- the heartbeat, so the update stays HOT.
    UPDATE shardq.tasks t
    SET lease_token = c.next
    FROM unnest(c_ids, c_next, c_actions) AS c(id, next, action)
    WHERE t.execution_id = ANY(fenced) AND t.execution_id = c.id AND c.action = 'keep';

    UPDATE shardq.tasks t
    SET lease_token = NULL, lease_owner = NULL, run_at = now() + make_interval(secs => c.delay)
    FROM unnest(c_ids, c_delays, c_actions) AS c(id, delay, action)
    WHERE t.execution_id = ANY(fenced) AND t.execution_id = c.id AND c.action = 'schedule';

    -- A run parking on a signal that already arrived stays due.
    INSERT INTO shardq.tasks (execution_id, run_at)
    SELECT p.id, now()
    FROM unnest(p_ids, p_names) AS p(id, name)
    WHERE p.id = ANY(fenced)
      AND EXISTS (
        SELECT 1 FROM shardq.signals s
        WHERE s.execution_id = p.id AND s.name = p.name AND s.consumed_at IS NULL
      )
    ON CONFLICT (execution_id) DO UPDATE
    SET run_at = now(), lease_token = NULL, lease_owner = NULL;

    RETURN QUERY
    SELECT x.id, x.cancel_requested FROM shardq.executions x WHERE x.id = ANY(fenced);
END
$$;

-- The per-attempt stamp the pipelined batch needed; the function keeps the
-- fenced ids in a variable instead.
ALTER TABLE shardq.executions DROP COLUMN commit_attempt;
