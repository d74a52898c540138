-- A batch of turn commits as one statement: the worker's group commit.
--
-- Why a function: sent as a psycopg pipeline (a fence statement and a
-- handful of writes), the client-side pipeline machinery cost more than the
-- statements. As a function the batch is one round trip, while each statement
-- inside still takes a fresh snapshot (READ COMMITTED, volatile function):
-- the writes after the fence see what a signal sender committed while the
-- fence waited for its locks, which is what keeps a parking run from missing
-- a signal.
--
-- The batch arrives as parallel arrays, one group per kind of write, which
-- the calling statement (store/queries.sql) builds from one text per column:
-- a JSON document of rows would cost the server a jsonb pass per value
-- (CHANGELOG.md, "Performance work").
--   c_*: a commit each: the run, its lease token, the next token (a checkpoint
--        rotates it), state, output (SQL NULL: none set; a workflow may
--        return null, which is jsonb 'null'), error, task action, delay,
--        close_wait
--   e_*: the events: run, position, kind, name, payload, wake_in
--   w_*: the waits opened: run, position, kind, name, deadline_in, request
--   s_*: the signals consumed: signal id, position
--   p_*: run, signal name: a row per name a parking run waits on
--   c_steps: a commit each: null, or the [position, name, payload] of the
--        step.completed event that ends its turn when the commit ends its run,
--        stored inside the outcome event (schema/0017) instead of in e_*
--   rare: null, or a document of the rare writes, signals to other runs:
--     local: [sender_id, position, target_id, signal_name, payload, key, max_pending,
--            max_pending_total, trace]: a signal to a run of this shard
--            (ctx.signal_external); `trace`, the sending turn's traceparent or null
--            (schema/0025), goes with the signal
--     outbox: [sender_id, position, target_id, target_bucket, signal_name, payload, key,
--             trace]: a signal to a run of another shard, written to the outbox for the
--             relay; the call's history event comes in e_*.
--     children: [parent_id, position, child_id, here, workflow, version, workflow_id,
--               input, priority, policy, gates]: a child run the commit starts
--               (ctx.start_child), on this shard when `here` and its bucket is
--               writable, else through the outbox (schema/0023)
--     continued: [run_id, input, generation, base]: the run continues as new
--                (ctx.continue_as_new) with this input, generation number and
--                first position
--     attributes: [run_id, {name: value or null}]: the search attributes the commit's
--                 turn set (ctx.set_attributes; null removes one), schema/0030
--     ends: [run_id, parent_id or null]: a run of a family (a child, or a parent
--           of children): if the commit ends it, its parent hears of it and its
--           children are asked to cancel (shardq.runs_ended); its parent is
--           locked with the signal targets, in their order.
-- A run whose bucket this shard cannot write (a move froze it, or moved it
-- away) commits nothing, as if its lease were lost; a signal to a run of such
-- a bucket is queued in the outbox instead (the relay finds its owner).
-- The answer is one row per commit that held its lease: its position in c_*
-- (from 1), whether cancellation was requested meanwhile, and the outcomes of
-- its signals to other runs (null when it sent none; a refused one carries
-- deliver_signals' reason_code and detail). Only a commit that finishes the
-- run writes its outcome (a `run.<state>` event); running, waiting and
-- pending are where the run's task and wait rows are, which the commit writes
-- anyway, so the wide executions row is never rewritten.
--
-- Measured with auto_explain on batches of 100 (these shaped the body):
-- - Rows are found with `= ANY(array)` (index probes), never by joining
--   unnest() to a table: the planner ran such joins as nested loops over the
--   whole array (the task DELETE took 7.8 of 13 ms; the signal consumption
--   ~25 us per run), or hash-joined them over a sequential scan. Per-row
--   values come from array_position() instead.
-- - Per-row `= ANY(fenced)` filters are skipped when every commit held its
--   lease, and writes whose arrays are empty are skipped.
-- - Its statements find rows by primary key, which a generic plan serves as
--   well as a custom one; custom planning of all of them cost ~0.5 ms per
--   call, so it plans once per connection.
CREATE OR REPLACE FUNCTION shardq.commit_turns_v2(
    lease_s float8,
    c_ids uuid[], c_tokens uuid[], c_next uuid[], c_states text[], c_outputs jsonb[],
    c_errors jsonb[], c_actions text[], c_delays float8[], c_close_wait boolean[],
    e_ids uuid[], e_positions integer[], e_kinds text[], e_names text[], e_payloads jsonb[],
    e_wake_ins float8[],
    w_ids uuid[], w_positions integer[], w_kinds text[], w_names text[],
    w_deadline_ins float8[], w_requests jsonb[],
    s_ids bigint[], s_positions integer[],
    p_ids uuid[], p_names text[],
    rare jsonb,
    c_steps jsonb[]
)
RETURNS TABLE (commit_ord integer, cancel_requested boolean, externals jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    fenced          uuid[];
    taken_at        jsonb;  -- consumed signal id -> the position that took it
    fused           boolean;
    fenced_ords     integer[];
    all_fenced      boolean;
    cancels         boolean[];
    deleting        uuid[];
    keeping         uuid[];
    scheduling      uuid[];
    released        text[];
    cancelling      uuid[] := '{}';
    i               integer;
    x_targets       uuid[] := '{}';
    sender          uuid;
    sender_tenant   text;
    sender_sent     jsonb;
    x_ids           uuid[];
    x_names         text[];
    x_payloads      jsonb[];
    x_keys          text[];
    x_positions     integer[];
    x_max           integer;
    x_max_total     integer;
    x_trace         text;
    sent            jsonb := '{}';
    held            uuid[];
    own_writable    bit(4096);
    own_unclean     boolean;
    local_away          uuid[] := '{}';
    away_out        jsonb := '{}';
    family          uuid[] := '{}';
    ended_runs      uuid[];
    here_docs       jsonb;
    away_docs       jsonb;
    continued_runs  uuid[];
BEGIN
    -- Signals to other runs of this shard: every lock their delivery takes is
    -- taken here, before the fence and the first delivery, in the global order:
    -- task rows (the senders' and the targets'), then the targets' executions
    -- rows, each set in id order. Delivered one by one in send order, a batch
    -- sending to T2 then T1 would hold T2 while waiting for T1, and close a
    -- cycle with any sender that locked T1 first (tests/integration/test_lock_order.py).
    -- A child's parent is locked with them: its end may reach the parent in this
    -- commit (shardq.runs_ended, deliver_control).
    IF rare ? 'ends' THEN
        SELECT coalesce(array_agg(DISTINCT (r->>1)::uuid), '{}') INTO family
        FROM jsonb_array_elements(rare->'ends') AS r WHERE r->>1 IS NOT NULL;
    END IF;
    IF rare ? 'local' THEN
        SELECT coalesce(array_agg(DISTINCT (r->>2)::uuid), '{}') INTO x_targets
        FROM jsonb_array_elements(rare->'local') AS r;
    END IF;
    IF rare ? 'local' OR cardinality(family) > 0 THEN
        PERFORM shardq.lock_runs(c_ids || x_targets || family, x_targets || family);
    END IF;

    -- A batch in which every commit ends its run (its task deleted, nothing
    -- parked, sent or granted) on a clean shard, a drain's usual batch, is
    -- fenced by deleting its task rows: each row is written once, not locked
    -- and then deleted (shardq.finish_tasks, which keeps the id order). Runs of
    -- a family (`ends`: a fan-in's children ending) take it too: lock_runs
    -- above locked their task rows with their parents', in the global order,
    -- and deleting rows this transaction holds waits on no one.
    fused := (rare IS NULL OR rare - 'ends' = '{}'::jsonb) AND c_actions <@ ARRAY['delete']
             AND NOT (c_states && ARRAY['waiting', 'input_required'])
             AND NOT (e_kinds && ARRAY['signal.timed_out', 'condition.timed_out',
                                       'interrupt.timed_out'])
             AND (SELECT shardq.unclean_writable()) IS NULL;
    IF fused THEN
        SELECT coalesce(array_agg(r.id ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.ord::integer ORDER BY r.ord), '{}'),
               coalesce(array_agg(g.cancel_requested ORDER BY r.ord), '{}'),
               array_agg(g.concurrency_key) FILTER (WHERE g.concurrency_key IS NOT NULL)
        INTO fenced, fenced_ords, cancels, released
        FROM unnest(c_ids) WITH ORDINALITY AS r(id, ord)
        JOIN shardq.finish_tasks(c_ids, c_tokens) AS g ON g.execution_id = r.id;
        -- Slots of keyed runs go back for the batch at once (release_slots.sql).
        IF released IS NOT NULL THEN
            PERFORM shardq.release_slots(released);
        END IF;
    ELSE
        -- Lock the task rows still leased with each commit's token, in id order so
        -- two batches never deadlock. The wide executions row is not touched: a
        -- run's state is where its rows are (see schema/0005's header).
        WITH req AS (
            SELECT * FROM unnest(c_ids, c_tokens) WITH ORDINALITY AS r(id, token, ord)
        ), locked AS (
            SELECT t.execution_id, t.cancel_requested
            FROM shardq.tasks t
            WHERE t.execution_id = ANY(c_ids)
              AND (t.execution_id, t.lease_token) IN (SELECT r.id, r.token FROM req r)
            ORDER BY t.execution_id
            FOR UPDATE OF t
        )
        SELECT coalesce(array_agg(r.id ORDER BY r.ord), '{}'),
               coalesce(array_agg(r.ord::integer ORDER BY r.ord), '{}'),
               coalesce(array_agg(l.cancel_requested ORDER BY r.ord), '{}')
        INTO fenced, fenced_ords, cancels
        FROM req r JOIN locked l ON l.execution_id = r.id;
    END IF;

    IF cardinality(fenced) = 0 THEN
        RETURN;
    END IF;
    -- Usually every lease held: the per-row `= ANY(fenced)` filters below,
    -- a scan of the whole array per row, are then skipped.
    all_fenced := cardinality(fenced) = cardinality(c_ids);

    -- The fence of a move (see shardq.fence): read after the row locks above
    -- gave this transaction its xid. A shard that holds rows of buckets it
    -- cannot write (frozen by a move, or moved away and not cleaned up yet)
    -- commits none of their turns: answered as a lost lease, each such turn
    -- runs again where its bucket is writable. A clean shard holds no such run.
    SELECT o.writable, o.unclean INTO own_writable, own_unclean FROM shardq.ownership o;
    IF fused AND own_unclean THEN
        -- A move froze buckets after the check above and before the DELETE took
        -- this transaction's xid (the freeze's wait for writers missed it), and
        -- its rows are deleted already: nothing of the batch may land. The
        -- worker retries a serialization failure; the retry takes the locking
        -- path, which drops the frozen runs' commits as lost leases.
        RAISE EXCEPTION 'shardq: a move froze buckets while a batch finished its runs'
            USING ERRCODE = '40001';
    END IF;
    IF own_unclean THEN
        SELECT coalesce(array_agg(f.id ORDER BY f.n), '{}'),
               coalesce(array_agg(f.ord ORDER BY f.n), '{}'),
               coalesce(array_agg(f.cancel ORDER BY f.n), '{}')
        INTO fenced, fenced_ords, cancels
        FROM unnest(fenced, fenced_ords, cancels) WITH ORDINALITY AS f(id, ord, cancel, n)
        WHERE get_bit(own_writable, shardq.bucket(f.id)) = 1;
        IF cardinality(fenced) = 0 THEN
            RETURN;
        END IF;
        all_fenced := cardinality(fenced) = cardinality(c_ids);
    END IF;

    -- A timeout is the store's to grant (see defer_premature_timeouts): a run
    -- whose wait was satisfied in time, or whose deadline has not passed by
    -- this clock, gets none of this commit, as if its lease were lost.
    IF e_kinds && ARRAY['signal.timed_out', 'condition.timed_out', 'interrupt.timed_out'] THEN
        held := shardq.defer_premature_timeouts(fenced, e_ids, e_positions, e_kinds, s_ids);
        IF cardinality(held) > 0 THEN
            SELECT coalesce(array_agg(f.id ORDER BY f.n), '{}'),
                   coalesce(array_agg(f.ord ORDER BY f.n), '{}'),
                   coalesce(array_agg(f.cancel ORDER BY f.n), '{}')
            INTO fenced, fenced_ords, cancels
            FROM unnest(fenced, fenced_ords, cancels) WITH ORDINALITY AS f(id, ord, cancel, n)
            WHERE NOT f.id = ANY(held);
            all_fenced := false;
            IF cardinality(fenced) = 0 THEN
                RETURN;
            END IF;
        END IF;
    END IF;

    -- A run whose cancellation was asked while it was leased ends cancelled at
    -- its first commit that is not a mid-turn checkpoint, whatever that commit
    -- would have done: its events (a step's result) are kept, its output, wait
    -- and parking are not. A checkpoint learns of it from the answer instead.
    IF true = ANY(cancels) THEN
        SELECT coalesce(array_agg(f.id), '{}') INTO cancelling
        FROM unnest(fenced, cancels) AS f(id, cancel)
        WHERE f.cancel AND c_actions[array_position(c_ids, f.id)] <> 'keep';
        IF cardinality(cancelling) > 0 THEN
            all_fenced := false;
            FOR i IN 1 .. cardinality(c_ids) LOOP
                IF c_ids[i] = ANY(cancelling) THEN
                    c_states[i] := 'cancelled';
                    c_outputs[i] := NULL;
                    c_actions[i] := 'delete';
                    c_close_wait[i] := true;
                END IF;
            END LOOP;
        END IF;
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
        WHERE (all_fenced OR e.execution_id = ANY(fenced))
        ORDER BY e.ord;
    END IF;

    -- Search attributes (schema/0030), with their run's tenant: a run probed by
    -- its id, as ended_runs' below.
    IF rare ? 'attributes' THEN
        WITH given AS (
            SELECT (r->>0)::uuid AS id, a.key AS name, a.value
            FROM jsonb_array_elements(rare->'attributes') AS r, jsonb_each(r->1) AS a
            WHERE all_fenced OR (r->>0)::uuid = ANY(fenced)
        ), removed AS (
            DELETE FROM shardq.run_attributes t USING given s
            WHERE s.value = 'null' AND t.execution_id = s.id AND t.name = s.name
        )
        INSERT INTO shardq.run_attributes (execution_id, name, tenant, value)
        SELECT s.id, s.name, x.tenant, s.value
        FROM given s,
             LATERAL (SELECT e.tenant FROM shardq.executions e WHERE e.id = s.id OFFSET 0) x
        WHERE s.value <> 'null'
        ON CONFLICT (execution_id, name) DO UPDATE SET value = EXCLUDED.value
        WHERE shardq.run_attributes.value IS DISTINCT FROM EXCLUDED.value;
    END IF;

    -- A finished run's last event says how it ended and carries its output or
    -- error: the only write of its outcome. It also carries the step its turn
    -- ended with (c_steps), whose seq is drawn here, in the SELECT, before the
    -- row's own (the identity default, filled in once the SELECT built the
    -- row), so the step sorts before its outcome (tests/integration/
    -- test_history_fold.py holds the order).
    IF c_states && ARRAY['completed', 'failed', 'cancelled', 'timed_out'] THEN
        INSERT INTO shardq.history (execution_id, position, kind, name, payload)
        SELECT c.id, NULL, 'run.' || c.state, 'run',
               CASE WHEN c.state = 'completed' THEN jsonb_build_object('output', c.output)
                    WHEN c.error IS NOT NULL THEN jsonb_build_object('error', c.error)
                    ELSE '{}'::jsonb END
               || CASE WHEN c.step IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('step', jsonb_build_array(
                           nextval('shardq.history_seq_seq'::regclass)) || c.step) END
        FROM unnest(c_ids, c_states, c_outputs, c_errors, c_steps)
             AS c(id, state, output, error, step)
        WHERE c.state IN ('completed', 'failed', 'cancelled', 'timed_out')
          AND (all_fenced OR c.id = ANY(fenced));
        -- And its row in the index of ended runs that listing reads (schema/0028).
        -- Each run probed by its id (OFFSET 0 keeps the probe one): a join's plan,
        -- cached for the session, could hash every run of the shard per batch.
        INSERT INTO shardq.ended_runs (tenant, state, execution_id, workflow_name)
        SELECT x.tenant, c.state, c.id, x.workflow_name
        FROM unnest(c_ids, c_states) AS c(id, state),
             LATERAL (SELECT e.tenant, e.workflow_name FROM shardq.executions e
                      WHERE e.id = c.id OFFSET 0) x
        WHERE c.state IN ('completed', 'failed', 'cancelled', 'timed_out')
          AND (all_fenced OR c.id = ANY(fenced));
    END IF;

    IF true = ANY(c_close_wait) THEN
        DELETE FROM shardq.waits w
        USING unnest(c_ids, c_close_wait) AS c(id, close)
        WHERE w.execution_id = ANY(fenced) AND w.execution_id = c.id AND c.close
          AND NOT (w.execution_id = ANY(w_ids) AND NOT w.execution_id = ANY(cancelling));
    END IF;

    IF cardinality(w_ids) > 0 THEN
        INSERT INTO shardq.waits AS cur (execution_id, position, kind, name, deadline, request)
        SELECT w.id, w.position, w.kind, w.name, now() + make_interval(secs => w.deadline_in),
               w.request
        FROM unnest(w_ids, w_positions, w_kinds, w_names, w_deadline_ins, w_requests)
             AS w(id, position, kind, name, deadline_in, request)
        WHERE (all_fenced OR (w.id = ANY(fenced) AND NOT w.id = ANY(cancelling)))
        ON CONFLICT (execution_id) DO UPDATE
        SET position = excluded.position, kind = excluded.kind, name = excluded.name,
            deadline = excluded.deadline, request = excluded.request;
    END IF;

    -- Each consumed signal's position looked up in a jsonb object of them (a binary
    -- search), from the pending signals of the fenced runs: no join for the planner
    -- to get wrong. Filtered by `id = ANY(s_ids)` with an array_position per row it
    -- was quadratic (0.9 s for a wait that took 10,000 children's outcomes); joined
    -- to unnest(s_ids), statistics taken before a burst made it a nested loop over
    -- the array for every pending signal (17.6 s for those 10,000).
    IF cardinality(s_ids) > 0 THEN
        taken_at := (SELECT jsonb_object_agg(c.id::text, c.position)
                     FROM unnest(s_ids, s_positions) AS c(id, position));
        UPDATE shardq.signals s
        SET consumed_at = now(), consumed_position = (taken_at ->> s.id::text)::integer
        WHERE s.execution_id = ANY(fenced) AND s.consumed_at IS NULL
          AND taken_at ? s.id::text;
    END IF;

    -- Task rows last: until here they carry the lease token the fence matched.
    SELECT array_agg(c.id) FILTER (WHERE c.action = 'delete'),
           array_agg(c.id) FILTER (WHERE c.action = 'keep'),
           array_agg(c.id) FILTER (WHERE c.action = 'schedule')
    INTO deleting, keeping, scheduling
    FROM unnest(c_ids, c_actions) AS c(id, action)
    WHERE all_fenced OR c.id = ANY(fenced);
    IF deleting IS NOT NULL AND NOT fused THEN
        -- Slots of keyed runs go back for the batch at once (release_slots.sql).
        WITH gone AS (
            DELETE FROM shardq.tasks t WHERE t.execution_id = ANY(deleting)
            RETURNING t.concurrency_key
        )
        SELECT array_agg(g.concurrency_key) INTO released
        FROM gone g WHERE g.concurrency_key IS NOT NULL;
        IF released IS NOT NULL THEN
            PERFORM shardq.release_slots(released);
        END IF;
        -- A run that parks leaves an open wait. One whose wait is gone had it
        -- closed while this turn held the lease (a decision, which cannot touch
        -- a leased task row): it stays due, rather than left with neither a task
        -- nor a wait, and its next turn finds the decision in its history.
        IF c_states && ARRAY['waiting', 'input_required'] THEN
            INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key,
                                      tenant, build_id)
            SELECT c.id, now(), 1, e.priority, e.concurrency_key, e.tenant,
                   CASE WHEN e.pinned THEN e.build_id END
            FROM unnest(c_ids, c_states) AS c(id, state)
            JOIN shardq.executions e ON e.id = c.id
            WHERE c.id = ANY(deleting) AND c.state IN ('waiting', 'input_required')
              AND NOT EXISTS (SELECT 1 FROM shardq.waits w WHERE w.execution_id = c.id)
            ON CONFLICT (execution_id) DO NOTHING;
        END IF;
    END IF;

    -- A checkpoint rotates the token and leaves the lease's expiry to the
    -- heartbeat, so the update stays HOT.
    IF keeping IS NOT NULL THEN
        UPDATE shardq.tasks t
        SET lease_token = c_next[array_position(c_ids, t.execution_id)]
        WHERE t.execution_id = ANY(keeping);
    END IF;

    IF scheduling IS NOT NULL THEN
        UPDATE shardq.tasks t
        SET lease_token = NULL, lease_owner = NULL, leased_until = NULL,
            run_at = now() + make_interval(
                secs => c_delays[array_position(c_ids, t.execution_id)])
        WHERE t.execution_id = ANY(scheduling);
    END IF;

    -- A run parking on a signal that already arrived stays due. The task row is
    -- not its first (claims = 1): its next claim reads its history. A run that
    -- waits on several names (a condition) has a row per name.
    IF cardinality(p_ids) > 0 THEN
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key,
                                  tenant, build_id)
        SELECT DISTINCT p.id, now(), 1, e.priority, e.concurrency_key, e.tenant,
               CASE WHEN e.pinned THEN e.build_id END
        FROM unnest(p_ids, p_names) AS p(id, name)
        JOIN shardq.executions e ON e.id = p.id
        WHERE (all_fenced OR (p.id = ANY(fenced) AND NOT p.id = ANY(cancelling)))
          AND EXISTS (
            SELECT 1 FROM shardq.signals s
            WHERE s.execution_id = p.id AND s.name = p.name AND s.consumed_at IS NULL
          )
        ON CONFLICT (execution_id) DO UPDATE
        SET run_at = now(), lease_token = NULL, lease_owner = NULL, leased_until = NULL;
    END IF;

    -- A wait for children counts the outcomes still needed from what the turn's
    -- claim read (`seen`: the newest signal id it had): outcomes that arrived
    -- since, while the parent was leased and could not be woken, count now,
    -- and a wait they satisfy leaves the run due (schema/0023).
    IF 'children' = ANY(w_kinds) THEN
        WITH late AS (
            SELECT w.execution_id, (w.request->>'need')::integer - count(s.id) AS need
            FROM shardq.waits w
            JOIN shardq.signals s ON s.execution_id = w.execution_id
                 AND s.name = 'shardq:run:child' AND s.consumed_at IS NULL
                 AND s.id > (w.request->>'seen')::bigint
            WHERE w.execution_id = ANY(w_ids) AND w.execution_id = ANY(fenced)
              AND w.kind = 'children'
            GROUP BY w.execution_id, w.request
        ), counted AS (
            UPDATE shardq.waits w SET request = w.request || jsonb_build_object('need', l.need)
            FROM late l WHERE w.execution_id = l.execution_id
            RETURNING w.execution_id, l.need
        )
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, concurrency_key,
                                  tenant, build_id)
        SELECT e.id, now(), 1, e.priority, e.concurrency_key, e.tenant,
               CASE WHEN e.pinned THEN e.build_id END
        FROM counted c JOIN shardq.executions e ON e.id = c.execution_id
        WHERE c.need <= 0
        ON CONFLICT (execution_id) DO UPDATE
        SET run_at = now(), lease_token = NULL, lease_owner = NULL, leased_until = NULL;
    END IF;

    -- Deliver them, each as a client signal from the sender's tenant would be,
    -- and record the outcome in the sender's history at the calling position:
    -- replay returns that, and never sends again. One deliver_signals call per
    -- sender with all its signals in send order (a fan-out of a thousand is one
    -- set-based statement, not a thousand calls), its outcomes recorded in one
    -- insert, its reasons deliver_signals', as a client or the relay would be told.
    --
    -- A target whose bucket this shard cannot write moved (or is moving) since
    -- the worker read its map: its signal goes through the outbox, as one to
    -- another shard would, recorded and answered as queued
    -- (`external.queued`, what workflow/context.py records for an outbox send);
    -- the relay finds the target's owner.
    IF rare ? 'local' AND own_writable IS NOT NULL THEN
        SELECT coalesce(array_agg(t), '{}') INTO local_away
        FROM unnest(x_targets) AS t WHERE get_bit(own_writable, shardq.bucket(t)) = 0;
    END IF;
    IF cardinality(local_away) > 0 THEN
        WITH away AS (
            SELECT (r->>0)::uuid AS sender, (r->>1)::integer AS position,
                   (r->>2)::uuid AS target, r->>3 AS name, r->4 AS payload, r->>5 AS key,
                   r->>8 AS trace, x.o
            FROM jsonb_array_elements(rare->'local') WITH ORDINALITY AS x(r, o)
            WHERE (r->>2)::uuid = ANY(local_away)
              AND (r->>0)::uuid = ANY(fenced) AND NOT (r->>0)::uuid = ANY(cancelling)
        ), queued AS (
            INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                                       target_bucket, tenant, signal_name, payload,
                                       idempotency_key, trace)
            SELECT a.sender, a.position, a.target, shardq.bucket(a.target)::smallint,
                   e.tenant, a.name, a.payload, a.key, a.trace
            FROM away a JOIN shardq.executions e ON e.id = a.sender
            ORDER BY a.o
        ), outcome AS (
            SELECT a.sender, a.position, a.name, a.o,
                   jsonb_build_object('target', a.target, 'name', a.name,
                                      'idempotency_key', a.key, 'queued', true) AS outcome
            FROM away a
        ), recorded AS (
            INSERT INTO shardq.history (execution_id, position, kind, name, payload)
            SELECT o.sender, o.position, 'external.queued', o.name, o.outcome
            FROM outcome o ORDER BY o.o
        )
        SELECT coalesce(jsonb_object_agg(g.sender, g.outcomes), '{}') INTO away_out
        FROM (SELECT o.sender::text AS sender,
                     jsonb_object_agg(o.position::text, o.outcome) AS outcomes
              FROM outcome o GROUP BY o.sender) AS g;
        IF away_out <> '{}' THEN
            PERFORM pg_notify(shardq.outbox_channel(), '');
        END IF;
    END IF;
    IF rare ? 'local' THEN
        FOR sender, sender_tenant, x_ids, x_names, x_payloads, x_keys, x_positions, x_max,
            x_max_total, x_trace IN
            SELECT (r->>0)::uuid, e.tenant,
                   array_agg((r->>2)::uuid ORDER BY o), array_agg(r->>3 ORDER BY o),
                   array_agg(r->4 ORDER BY o), array_agg(r->>5 ORDER BY o),
                   array_agg((r->>1)::integer ORDER BY o),
                   min((r->>6)::integer), min((r->>7)::integer), min(r->>8)
            FROM jsonb_array_elements(rare->'local') WITH ORDINALITY AS x(r, o)
            JOIN shardq.executions e ON e.id = (r->>0)::uuid
            WHERE (r->>0)::uuid = ANY(fenced) AND NOT (r->>0)::uuid = ANY(cancelling)
              AND NOT (r->>2)::uuid = ANY(local_away)
            GROUP BY 1, 2
            ORDER BY min(o)
        LOOP
            WITH outcomes AS (
                SELECT d.ord,
                       jsonb_build_object('target', x_ids[d.ord], 'name', x_names[d.ord],
                                          'idempotency_key', x_keys[d.ord])
                       || CASE WHEN d.reason_code IS NOT NULL
                               THEN jsonb_build_object('reason_code', d.reason_code,
                                                       'detail', d.detail)
                               ELSE jsonb_build_object(
                                   'signal_id', coalesce(d.signal_id, d.earlier_id),
                                   'delivered', d.signal_id IS NOT NULL) END AS outcome
                FROM shardq.deliver_signals(
                    sender_tenant, x_ids, x_names, x_payloads, x_keys, x_max, x_max_total,
                    NULL::text[], array_fill(x_trace, ARRAY[cardinality(x_ids)])) AS d
            ), recorded AS (
                INSERT INTO shardq.history (execution_id, position, kind, name, payload)
                SELECT sender, x_positions[o.ord],
                       CASE WHEN o.outcome ? 'reason_code' THEN 'external.failed'
                            ELSE 'external.sent' END,
                       x_names[o.ord], o.outcome
                FROM outcomes o ORDER BY o.ord
            )
            SELECT jsonb_agg(o.outcome ORDER BY o.ord) INTO sender_sent FROM outcomes o;
            -- Keyed by the sender's id as uuid text (the document spells it as hex).
            sent := sent || jsonb_build_object(sender::text, sender_sent);
        END LOOP;
    END IF;
    -- Each sender's answer in send order: the queued outcomes slotted between
    -- the delivered ones (the k-th delivered item is the k-th of its answer).
    IF away_out <> '{}' THEN
        WITH item AS (
            SELECT ((r->>0)::uuid)::text AS sender, r->>1 AS position, x.o,
                   (away_out->((r->>0)::uuid)::text) ? (r->>1) AS away
            FROM jsonb_array_elements(rare->'local') WITH ORDINALITY AS x(r, o)
            WHERE away_out ? ((r->>0)::uuid)::text
        ), numbered AS (
            SELECT i.*, (count(*) FILTER (WHERE NOT i.away)
                         OVER (PARTITION BY i.sender ORDER BY i.o))::integer - 1 AS k
            FROM item i
        )
        SELECT sent || jsonb_object_agg(g.sender, g.outcomes) INTO sent
        FROM (SELECT n.sender,
                     jsonb_agg(CASE WHEN n.away THEN away_out->n.sender->n.position
                                    ELSE sent->n.sender->n.k END ORDER BY n.o) AS outcomes
              FROM numbered n GROUP BY n.sender) AS g;
    END IF;

    -- Signals to runs of other shards: a row each, in send order (the relay
    -- delivers one sender's rows to one target in id order), and one hint to
    -- the relays. Kept like the commit's events when the run is cancelling.
    IF rare ? 'outbox' THEN
        INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                                   target_bucket, tenant, signal_name, payload, idempotency_key,
                                   trace)
        SELECT (r->>0)::uuid, (r->>1)::integer, (r->>2)::uuid, (r->>3)::smallint, x.tenant,
               r->>4, r->5, r->>6, r->>7
        FROM jsonb_array_elements(rare->'outbox') WITH ORDINALITY AS o(r, ord)
        JOIN shardq.executions x ON x.id = (r->>0)::uuid
        WHERE (r->>0)::uuid = ANY(fenced)
        ORDER BY o.ord;
        IF FOUND THEN
            PERFORM pg_notify(shardq.outbox_channel(), '');
        END IF;
    END IF;

    -- Children the turns started (none for a run cancelled in this commit): each
    -- parent lists its own; a child whose bucket is writable here is created
    -- now (start_child_runs), the others get an outbox row each.
    IF rare ? 'children' THEN
        WITH doc AS (
            SELECT (r->>0)::uuid AS parent, (r->>1)::integer AS position,
                   (r->>2)::uuid AS child, r->>4 AS workflow, r->>6 AS workflow_id,
                   r->>9 AS policy, e.tenant, x.o,
                   (r->>3)::boolean AND (own_writable IS NULL
                       OR get_bit(own_writable, shardq.bucket((r->>2)::uuid)) = 1) AS here,
                   jsonb_build_object('id', r->2, 'parent', r->0, 'position', r->1,
                                      'tenant', e.tenant, 'workflow', r->4, 'version', r->5,
                                      'workflow_id', r->6, 'input', r->7, 'priority', r->8,
                                      'gates', r->10, 'trace', r->11) AS start,
                   r->>11 AS trace
            FROM jsonb_array_elements(rare->'children') WITH ORDINALITY AS x(r, o)
            JOIN shardq.executions e ON e.id = (r->>0)::uuid
            WHERE (r->>0)::uuid = ANY(fenced) AND NOT (r->>0)::uuid = ANY(cancelling)
        ), listed AS (
            INSERT INTO shardq.children (parent_id, child_id, position, workflow_name,
                                         workflow_id, policy)
            SELECT d.parent, d.child, d.position, d.workflow, d.workflow_id, d.policy
            FROM doc d ORDER BY d.o
            ON CONFLICT (parent_id, child_id) DO NOTHING
        ), queued AS (
            INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                                       target_bucket, tenant, signal_name, payload, trace)
            SELECT d.parent, d.position, d.child, shardq.bucket(d.child)::smallint, d.tenant,
                   'shardq:run:start', d.start, d.trace
            FROM doc d WHERE NOT d.here ORDER BY d.o
            ON CONFLICT (source_execution_id, source_position) DO NOTHING
            RETURNING 1
        )
        SELECT jsonb_agg(d.start ORDER BY d.o) FILTER (WHERE d.here),
               (SELECT to_jsonb(count(*)) FROM queued)
        INTO here_docs, away_docs FROM doc d;
        IF away_docs::integer > 0 THEN
            PERFORM pg_notify(shardq.outbox_channel(), '');
        END IF;
        IF here_docs IS NOT NULL THEN
            PERFORM shardq.start_child_runs(here_docs);
        END IF;
    END IF;

    -- Runs of a family that this commit ended: their parents and children hear of it.
    IF rare ? 'ends' THEN
        SELECT array_agg((r->>0)::uuid) INTO ended_runs
        FROM jsonb_array_elements(rare->'ends') AS r
        WHERE (r->>0)::uuid = ANY(fenced)
          AND c_states[array_position(c_ids, (r->>0)::uuid)]
              IN ('completed', 'failed', 'cancelled', 'timed_out');
        IF ended_runs IS NOT NULL THEN
            PERFORM shardq.runs_ended(ended_runs);
        END IF;
    END IF;

    -- Runs that continue as new (ctx.continue_as_new) start their next generation
    -- in place: the same id, the new input, a history emptied but for a marker
    -- that numbers the generation and where its positions start (a child keeps
    -- its child.of), consumed signals dropped and unconsumed ones kept; the task
    -- row is due now (its `schedule` action). Live children of policy cancel are
    -- asked to cancel, as at a run's end, and the run's list of children goes.
    IF rare ? 'continued' THEN
        SELECT array_agg((r->>0)::uuid) INTO continued_runs
        FROM jsonb_array_elements(rare->'continued') AS r
        WHERE (r->>0)::uuid = ANY(fenced) AND NOT (r->>0)::uuid = ANY(cancelling);
    END IF;
    IF continued_runs IS NOT NULL THEN
        WITH nxt AS (
            SELECT (r->>0)::uuid AS id, r->1 AS input, (r->>2)::integer AS generation,
                   (r->>3)::integer AS base
            FROM jsonb_array_elements(rare->'continued') AS r
            WHERE (r->>0)::uuid = ANY(continued_runs)
        ), emptied AS (
            DELETE FROM shardq.history h
            WHERE h.execution_id = ANY(continued_runs) AND h.kind <> 'child.of'
        ), dropped AS (
            DELETE FROM shardq.signals s
            WHERE s.execution_id = ANY(continued_runs) AND s.consumed_at IS NOT NULL
        ), renewed AS (
            -- The next generation takes its workflow's current build (schema/0026):
            -- continuing as new is how a run that never ends moves to new code.
            UPDATE shardq.executions x
            SET input = n.input,
                build_id = (SELECT b.build_id FROM shardq.workflow_builds b
                            WHERE b.workflow_name = x.workflow_name),
                pinned = coalesce((SELECT b.pinned FROM shardq.workflow_builds b
                                   WHERE b.workflow_name = x.workflow_name), false)
            FROM nxt n WHERE x.id = n.id
        )
        INSERT INTO shardq.history (execution_id, position, kind, name, payload)
        SELECT n.id, NULL, 'run.continued', 'run',
               jsonb_build_object('generation', n.generation, 'base', n.base)
        FROM nxt n;
        UPDATE shardq.tasks t
        SET build_id = CASE WHEN e.pinned THEN e.build_id END
        FROM shardq.executions e
        WHERE t.execution_id = ANY(continued_runs) AND e.id = t.execution_id
          AND t.build_id IS DISTINCT FROM CASE WHEN e.pinned THEN e.build_id END;
        PERFORM shardq.runs_ended(continued_runs);
        DELETE FROM shardq.children c WHERE c.parent_id = ANY(continued_runs);
    END IF;

    RETURN QUERY
    SELECT f.ord, f.cancel, sent->(f.id::text)
    FROM unnest(fenced, fenced_ords, cancels) AS f(id, ord, cancel);
END
$$;
