-- Lease up to `lim` due tasks: run_at has passed and no live lease holds them
-- (leased_until unset or past), so an expired lease is due again and any
-- worker re-claims it. Higher priority first: the levels 9..1 from the
-- partial index tasks_urgent, one probe for each level present, then the rest
-- of the batch at priority 0, shared fairly between tenants (below); within a
-- level, by run_at (schema/0019). With min_priority > 0, only levels from it up: the claim a
-- worker makes at once when a NOTIFY says urgent work came due (the payload
-- 'urgent'), instead of waiting for a full batch of free turn slots. The
-- lease is written to columns no index holds, so the update stays HOT
-- (schema/0018); the row keeps its run_at, and claims step over the live
-- leases at the head of tasks_due until a heartbeat moves them. The claimed
-- rows come first; a last row with a NULL execution_id carries the seconds
-- until the next task is due (timer, retry or lease expiry) and, as its
-- tenant, the cursor the caller passes to its next claim.
--
-- Builds (schema/0026): a worker of a build (`build`) takes its build's pinned
-- runs (shardq.claim_pinned) as well as unpinned ones: half its batch first,
-- then the unpinned passes below, then its pinned runs again for what they
-- left, so neither kind waits behind a backlog of the other. A worker without
-- a build claims unpinned runs only. Every unpinned pass reads the indexes
-- that hold no pinned row (`build_id IS NULL`): another build's due runs are
-- never stepped over.
--
-- Fairness (schema/0021): the priority-0 part of the batch is first shared
-- between tenants (shardq.claim_fair); what it leaves comes from tasks_due in
-- due order, so a claim never leaves due work unclaimed that it had room for.
--
-- One statement rather than a pipelined transaction of three: measured here,
-- a pipelined transaction cost ~1 ms and one statement on an autocommit
-- connection ~0.35 ms, and the claim sits on the signal -> resumed step path.
-- It keeps custom plans on purpose: its LIMIT and its `run_at <= now()` range
-- are what keep the due-index scan short beside a million parked timers, and
-- a generic plan would guess at both.
--
-- Every row it reads it finds by key or by a due index, so it never scans a
-- table whole: sequential scans are off for its statements. Statistics taken
-- while a queue table was nearly empty (a fresh deployment, a burst after a
-- quiet night: autovacuum analyzes by the minute) otherwise made it scan every
-- task, execution and history row per claimed run: 0.4 s a claim once 10,000
-- children were due (measured, docs/composition.md). JIT is off with it: a scan
-- that has no index to use (the one-row ownership table) is then priced past
-- jit_above_cost, and compiling it took 0.2 s a claim.
CREATE OR REPLACE FUNCTION shardq.claim_tasks(
    owner text, lim integer, lease_s float8, min_priority smallint, after_tenant text,
    build text DEFAULT NULL)
RETURNS TABLE (
    execution_id     uuid,
    lease_token      uuid,
    claims           integer,
    tenant           text,
    workflow_name    text,
    workflow_version integer,
    workflow_id      text,
    input            text,
    cancel_requested boolean,
    db_now           timestamptz,
    history          text,
    signals          text,
    next_due_in      float8,
    trace            text
)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    -- While this shard holds rows of buckets it cannot write (a move froze them,
    -- or moved them away and has not cleaned up yet), those runs are not
    -- claimed: the buckets it can write. NULL on a clean shard, where the
    -- custom plan then drops the filter altogether.
    claimable bit(4096);
    claimed   integer;
    -- Rows of priority 1-9 picked (and locked) before the priority-0 pass.
    urgent    uuid[] := '{}';
    level     smallint;
    -- Priority-0 rows the fair pass picked (and locked), and where its walk over
    -- tenants stopped (shardq.claim_fair).
    want      integer;
    fair      uuid[] := '{}';
    cursor_at text := after_tenant;
    -- Priority-0 rows past the fair pass, and the pinned runs of the worker's build.
    rest      uuid[] := '{}';
    pinned    uuid[] := '{}';
BEGIN
    claimable := shardq.unclean_writable();
    IF build IS NOT NULL THEN
        pinned := shardq.claim_pinned(build, min_priority, lim - lim / 2, claimable, '{}');
    END IF;

    -- A level's due rows are a range of tasks_urgent that stops at now(); its
    -- future timers are never read. Levels with nothing due cost a probe each.
    level := (SELECT max(t.priority) FROM shardq.tasks t
              WHERE t.priority > 0 AND t.build_id IS NULL);
    WHILE level >= min_priority AND cardinality(pinned) + cardinality(urgent) < lim LOOP
        urgent := urgent || ARRAY(
            SELECT d.execution_id
            FROM shardq.tasks d
            WHERE d.priority = level AND d.build_id IS NULL AND d.run_at <= now()
              AND (d.leased_until IS NULL OR d.leased_until <= now())
              AND (claimable IS NULL OR get_bit(claimable, shardq.bucket(d.execution_id)) = 1)
            ORDER BY d.priority DESC, d.run_at
            LIMIT lim - cardinality(pinned) - cardinality(urgent)
            FOR UPDATE SKIP LOCKED);
        level := (SELECT max(t.priority) FROM shardq.tasks t
                  WHERE t.priority > 0 AND t.build_id IS NULL AND t.priority < level);
    END LOOP;

    want := CASE WHEN min_priority > 0 THEN 0
                 ELSE lim - cardinality(pinned) - cardinality(urgent) END;
    IF want > 0 THEN
        SELECT f.runs, f.cursor_at, f.rest INTO fair, cursor_at, want
        FROM shardq.claim_fair(after_tenant, want, claimable) f;
    END IF;
    IF want > 0 THEN
        -- Priority 0 past the fair pass. Rows it took are locked by this
        -- transaction, which SKIP LOCKED does not skip: excluded by id.
        rest := ARRAY(
            SELECT d.execution_id
            FROM shardq.tasks d
            WHERE d.run_at <= now() AND d.priority = 0 AND d.build_id IS NULL
              AND (d.leased_until IS NULL OR d.leased_until <= now())
              AND (claimable IS NULL OR get_bit(claimable, shardq.bucket(d.execution_id)) = 1)
              AND d.execution_id <> ALL(fair)
            ORDER BY d.run_at
            LIMIT want
            FOR UPDATE SKIP LOCKED);
    END IF;
    want := lim - cardinality(pinned) - cardinality(urgent) - cardinality(fair)
            - cardinality(rest);
    IF build IS NOT NULL AND want > 0 THEN
        pinned := pinned || shardq.claim_pinned(build, min_priority, want, claimable, pinned);
    END IF;

    -- Losing a claim in a server crash only leaves its task due (the turn's
    -- fenced commit then fails), and the turn's own durable commit flushes the
    -- WAL past the claim anyway. Transaction-local: the caller is autocommit.
    PERFORM set_config('synchronous_commit', 'off', true);

    RETURN QUERY
    WITH leased AS (
        UPDATE shardq.tasks t
        SET lease_token = gen_random_uuid(),
            lease_owner = owner,
            leased_until = now() + make_interval(secs => lease_s),
            claims = t.claims + 1
        WHERE t.execution_id = ANY(urgent || fair || rest || pinned)
        RETURNING t.execution_id, t.lease_token, t.claims, t.cancel_requested, t.priority
    )
    SELECT
        l.execution_id, l.lease_token, l.claims,
        x.tenant, x.workflow_name, x.workflow_version, x.workflow_id, x.input::text,
        l.cancel_requested, now(),
        -- A run's first task row, claimed for the first time, has nothing to
        -- replay (only lease holders write the events replay reads): skip the
        -- history probe. Task rows inserted later (a woken run) start at 1.
        -- No history, no pending signals: NULL. The table, not shardq.events:
        -- only an outcome event holds a folded step (schema/0017), and a run
        -- with an outcome has no task row left to claim.
        CASE WHEN l.claims = 1 THEN NULL ELSE
            (SELECT json_agg(json_build_array(h.seq, h.position, h.kind, h.name, h.payload)
                             ORDER BY h.seq)
             FROM shardq.history h WHERE h.execution_id = l.execution_id)::text
        END,
        (SELECT json_agg(json_build_array(s.id, s.name, s.payload, s.idempotency_key,
                                          s.received_at, s.trace) ORDER BY s.id)
         FROM shardq.signals s
         WHERE s.execution_id = l.execution_id AND s.consumed_at IS NULL)::text,
        NULL::float8,
        -- The start's trace context (schema/0025), for a first turn to continue.
        x.trace
    FROM leased l
    CROSS JOIN LATERAL (
        SELECT * FROM shardq.executions e WHERE e.id = l.execution_id OFFSET 0
    ) x
    -- The worker queues a batch's turns in this order: its urgent runs go first.
    ORDER BY l.priority DESC;

    GET DIAGNOSTICS claimed = ROW_COUNT;
    -- A full batch: more may be due now (0). Otherwise the first of the next
    -- timer (or moved lease) and the first expiry among the live leases at the
    -- head of tasks_due. That head is read up to 1,000 rows: an expiry past
    -- them is found by the worker's poll instead, a rescue later, not lost.
    -- The same of the worker's build's pinned rows.
    RETURN QUERY
    SELECT NULL::uuid, NULL::uuid, NULL::integer, cursor_at, NULL::text, NULL::integer,
           NULL::text, NULL::text, NULL::boolean, now(), NULL::text, NULL::text,
           CASE WHEN claimed >= lim THEN 0::float8 ELSE
               extract(epoch FROM least(
                   (SELECT min(t.run_at) FROM shardq.tasks t
                    WHERE t.run_at > now() AND t.build_id IS NULL
                      AND (claimable IS NULL
                           OR get_bit(claimable, shardq.bucket(t.execution_id)) = 1)),
                   (SELECT min(coalesce(h.leased_until, h.run_at)) FROM (
                        SELECT t.run_at, t.leased_until FROM shardq.tasks t
                        WHERE t.run_at <= now() AND t.build_id IS NULL
                          AND (claimable IS NULL
                               OR get_bit(claimable, shardq.bucket(t.execution_id)) = 1)
                        ORDER BY t.run_at LIMIT 1000) h),
                   CASE WHEN build IS NOT NULL THEN shardq.pinned_due(build, claimable) END
               ) - now())::float8 END,
           NULL::text;
END
$$;
