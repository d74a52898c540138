-- Claims and signal deliveries as single statements; commit_turns() without
-- its quadratic task writes and planned once per connection.
--
-- Claims and deliveries used to go out as psycopg pipelines (a transaction of
-- three statements); measured here, a pipelined transaction costs ~1 ms where
-- one statement on an autocommit connection costs ~0.35 ms, and both sit on
-- the signal -> resumed step path. As functions they are one round trip, while
-- every statement inside still takes its own snapshot (READ COMMITTED,
-- volatile): the work statement of a delivery runs after its lock statements
-- and sees a parking commit that held those locks.
--
-- commit_turns() (schema/0002), measured with auto_explain on a batch of 100:
-- 13 ms, of which the task DELETE took 7.8: joined to unnest(), it probed the
-- primary key with the whole `= ANY(fenced)` array once per commit, O(n^2)
-- buffer hits. Task writes now take the ids of each action as one array (one
-- index probe per row) and read per-row values with array_position(). Custom
-- planning of its ten statements cost another ~0.5 ms per call; they find
-- rows by primary key, which a generic plan serves as well, so it plans once
-- per connection. Writes whose arrays are empty are skipped. The claim keeps
-- custom plans: its LIMIT and its `run_at <= now()` range are what keep the
-- due-index scan short beside a million parked timers, and a generic plan
-- would guess at both.

-- The batch arrives as one jsonb document instead of 26 arrays: the driver
-- spent more CPU dumping the arrays, element by element, than the server spent
-- applying them. `batch` holds one array of rows per kind of write:
--   c: [id, token, next, state, output, error, action, delay, close_wait]
--      (output is [value] when the commit sets one: a workflow may return null)
--   e: [execution_id, position, kind, name, payload, wake_in]
--   w: [execution_id, position, kind, name, deadline_in, request]
--   s: [signal_id, position]
--   p: [execution_id, signal_name]
-- Every key but `c` is left out when it would be empty.
DROP FUNCTION shardq.commit_turns(
    float8, uuid[], uuid[], uuid[], text[], jsonb[], jsonb[], text[], float8[], boolean[],
    uuid[], integer[], text[], text[], jsonb[], float8[],
    uuid[], integer[], text[], text[], float8[], jsonb[], bigint[], integer[], uuid[], text[]
);

CREATE FUNCTION shardq.commit_turns(lease_s float8, batch jsonb)
RETURNS TABLE (id uuid, cancel_requested boolean)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    c_ids           uuid[];
    c_tokens        uuid[];
    c_next          uuid[];
    c_states        text[];
    c_outputs       jsonb[];
    c_errors        jsonb[];
    c_actions       text[];
    c_delays        float8[];
    c_close_wait    boolean[];
    e_ids           uuid[] := '{}';
    e_positions     integer[];
    e_kinds         text[];
    e_names         text[];
    e_payloads      jsonb[];
    e_wake_ins      float8[];
    w_ids           uuid[] := '{}';
    w_positions     integer[];
    w_kinds         text[];
    w_names         text[];
    w_deadline_ins  float8[];
    w_requests      jsonb[];
    s_ids           bigint[] := '{}';
    s_positions     integer[];
    p_ids           uuid[] := '{}';
    p_names         text[];
    fenced          uuid[];
    cancels         boolean[];
    deleting        uuid[];
    keeping         uuid[];
    scheduling      uuid[];
BEGIN
    SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
           array_agg((r->>1)::uuid ORDER BY o),
           array_agg((r->>2)::uuid ORDER BY o),
           array_agg(r->>3 ORDER BY o),
           array_agg(CASE WHEN jsonb_typeof(r->4) = 'array' THEN r->4->0 END ORDER BY o),
           array_agg(nullif(r->5, 'null') ORDER BY o),
           array_agg(r->>6 ORDER BY o),
           array_agg((r->>7)::float8 ORDER BY o),
           array_agg((r->>8)::boolean ORDER BY o)
    INTO c_ids, c_tokens, c_next, c_states, c_outputs, c_errors, c_actions, c_delays,
         c_close_wait
    FROM jsonb_array_elements(batch->'c') WITH ORDINALITY AS x(r, o);

    -- The other kinds are absent from the document when the batch has none.
    IF batch ? 'e' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o),
               array_agg(r->>2 ORDER BY o),
               array_agg(r->>3 ORDER BY o),
               array_agg(r->4 ORDER BY o),
               array_agg((r->>5)::float8 ORDER BY o)
        INTO e_ids, e_positions, e_kinds, e_names, e_payloads, e_wake_ins
        FROM jsonb_array_elements(batch->'e') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 'w' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o),
               array_agg(r->>2 ORDER BY o),
               array_agg(r->>3 ORDER BY o),
               array_agg((r->>4)::float8 ORDER BY o),
               array_agg(nullif(r->5, 'null') ORDER BY o)
        INTO w_ids, w_positions, w_kinds, w_names, w_deadline_ins, w_requests
        FROM jsonb_array_elements(batch->'w') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 's' THEN
        SELECT coalesce(array_agg((r->>0)::bigint ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o)
        INTO s_ids, s_positions
        FROM jsonb_array_elements(batch->'s') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 'p' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'), array_agg(r->>1 ORDER BY o)
        INTO p_ids, p_names
        FROM jsonb_array_elements(batch->'p') WITH ORDINALITY AS x(r, o);
    END IF;

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
    SELECT coalesce(array_agg(u.id), '{}'), coalesce(array_agg(u.cancel_requested), '{}')
    INTO fenced, cancels
    FROM updated u;

    IF cardinality(fenced) = 0 THEN
        RETURN;
    END IF;

    IF cardinality(e_ids) > 0 THEN
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
    END IF;

    IF true = ANY(c_close_wait) THEN
        DELETE FROM shardq.waits w
        USING unnest(c_ids, c_close_wait) AS c(id, close)
        WHERE w.execution_id = ANY(fenced) AND w.execution_id = c.id AND c.close
          AND NOT w.execution_id = ANY(w_ids);
    END IF;

    IF cardinality(w_ids) > 0 THEN
        INSERT INTO shardq.waits AS cur (execution_id, position, kind, name, deadline, request)
        SELECT w.id, w.position, w.kind, w.name, now() + make_interval(secs => w.deadline_in),
               w.request
        FROM unnest(w_ids, w_positions, w_kinds, w_names, w_deadline_ins, w_requests)
             AS w(id, position, kind, name, deadline_in, request)
        WHERE w.id = ANY(fenced)
        ON CONFLICT (execution_id) DO UPDATE
        SET position = excluded.position, kind = excluded.kind, name = excluded.name,
            deadline = excluded.deadline, request = excluded.request;
    END IF;

    IF cardinality(s_ids) > 0 THEN
        UPDATE shardq.signals s
        SET consumed_at = now(), consumed_position = c.position
        FROM unnest(s_ids, s_positions) AS c(id, position)
        WHERE s.id = ANY(s_ids) AND s.id = c.id AND s.consumed_at IS NULL
          AND s.execution_id = ANY(fenced);
    END IF;

    -- Task rows last: until here they carry the lease token the fence matched.
    SELECT array_agg(c.id) FILTER (WHERE c.action = 'delete'),
           array_agg(c.id) FILTER (WHERE c.action = 'keep'),
           array_agg(c.id) FILTER (WHERE c.action = 'schedule')
    INTO deleting, keeping, scheduling
    FROM unnest(c_ids, c_actions) AS c(id, action)
    WHERE c.id = ANY(fenced);
    IF deleting IS NOT NULL THEN
        DELETE FROM shardq.tasks t WHERE t.execution_id = ANY(deleting);
    END IF;

    -- A checkpoint rotates the token and leaves run_at (the lease expiry) to
    -- the heartbeat, so the update stays HOT.
    IF keeping IS NOT NULL THEN
        UPDATE shardq.tasks t
        SET lease_token = c_next[array_position(c_ids, t.execution_id)]
        WHERE t.execution_id = ANY(keeping);
    END IF;

    IF scheduling IS NOT NULL THEN
        UPDATE shardq.tasks t
        SET lease_token = NULL, lease_owner = NULL,
            run_at = now() + make_interval(
                secs => c_delays[array_position(c_ids, t.execution_id)])
        WHERE t.execution_id = ANY(scheduling);
    END IF;

    -- A run parking on a signal that already arrived stays due.
    IF cardinality(p_ids) > 0 THEN
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
    END IF;

    RETURN QUERY SELECT * FROM unnest(fenced, cancels);
END
$$;

-- Lease up to `lim` due tasks. While leased, run_at is the lease expiry, so an
-- expired lease is simply due again and any worker re-claims it. The claimed
-- rows come first; a last row with a NULL execution_id carries the seconds
-- until the next task is due (timer, retry or lease expiry), read after the
-- update so the rows just leased count with their new expiry.
CREATE FUNCTION shardq.claim_tasks(owner text, lim integer, lease_s float8)
RETURNS TABLE (
    execution_id     uuid,
    lease_token      uuid,
    claims           integer,
    tenant           text,
    workflow_name    text,
    workflow_version integer,
    workflow_id      text,
    input            text,
    state            text,
    cancel_requested boolean,
    db_now           timestamptz,
    history          text,
    signals          text,
    next_due_in      float8
)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- Losing a claim in a server crash only leaves its task due (the turn's
    -- fenced commit then fails), and the turn's own durable commit flushes the
    -- WAL past the claim anyway. Transaction-local: the caller is autocommit.
    PERFORM set_config('synchronous_commit', 'off', true);

    RETURN QUERY
    WITH leased AS (
        UPDATE shardq.tasks t
        SET lease_token = gen_random_uuid(),
            lease_owner = owner,
            run_at = now() + make_interval(secs => lease_s),
            claims = t.claims + 1
        WHERE t.execution_id = ANY(ARRAY(
            SELECT d.execution_id
            FROM shardq.tasks d
            WHERE d.run_at <= now()
            ORDER BY d.run_at
            LIMIT lim
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING t.execution_id, t.lease_token, t.claims
    )
    SELECT
        l.execution_id, l.lease_token, l.claims,
        x.tenant, x.workflow_name, x.workflow_version, x.workflow_id, x.input::text,
        x.state, x.cancel_requested, now(),
        -- A run never claimed before has nothing to replay (only lease holders
        -- write the events replay reads): skip the history probe. A woken or
        -- retried run is not `pending` on its first claim of a new task row,
        -- or has claimed this row before. No history, no pending signals: NULL.
        CASE WHEN l.claims = 1 AND x.state = 'pending' THEN NULL ELSE
            (SELECT json_agg(json_build_array(h.seq, h.position, h.kind, h.name, h.payload)
                             ORDER BY h.seq)
             FROM shardq.history h WHERE h.execution_id = l.execution_id)::text
        END,
        (SELECT json_agg(json_build_array(s.id, s.name, s.payload) ORDER BY s.id)
         FROM shardq.signals s
         WHERE s.execution_id = l.execution_id AND s.consumed_at IS NULL)::text,
        NULL::float8
    FROM leased l
    CROSS JOIN LATERAL (
        SELECT * FROM shardq.executions e WHERE e.id = l.execution_id OFFSET 0
    ) x;

    RETURN QUERY
    SELECT NULL::uuid, NULL::uuid, NULL::integer, NULL::text, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::text, NULL::boolean, now(), NULL::text, NULL::text,
           extract(epoch FROM min(t.run_at) - now())::float8
    FROM shardq.tasks t;
END
$$;

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
CREATE FUNCTION shardq.deliver_signals(
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
               (SELECT count(pg_notify('shardq_wake', '')) FROM woken)
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
            (SELECT count(pg_notify('shardq_wake', '')) FROM woken);
    END LOOP;
END
$$;
