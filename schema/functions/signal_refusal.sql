-- Whether a signal may be stored, and if not why: the one decision of a
-- refusal's reason code and message. deliver_signals admits by it and answers
-- with it, so a client's signal, the relay's delivery and a run's
-- ctx.signal_external to a run of its own shard (commit_turns_v2) are refused
-- with the same code for the same reason. No row's fields, no refusal: a
-- repeated idempotency key or origin (p_earlier_id) is not refused, and
-- stores nothing either.
--   p_run_tenant: the target run's tenant, NULL when there is no such run;
--     another tenant's run is not found, as no run at all.
--   p_gate_closed: the name is one of the run's gates and already taken.
--   p_pending, p_pending_total: the run's unconsumed signals of that name, of
--     all names, before this one.
CREATE OR REPLACE FUNCTION shardq.signal_refusal(
    p_target            uuid,
    p_tenant            text,
    p_name              text,
    p_max_pending       integer,
    p_max_pending_total integer,
    p_run_tenant        text,
    p_finished          text,
    p_earlier_id        bigint,
    p_gate_closed       boolean,
    p_pending           bigint,
    p_pending_total     bigint
) RETURNS TABLE (reason_code text, detail text)
-- A set-returning SQL function of one SELECT: inlined into the caller's plan.
LANGUAGE sql STABLE AS $$
    SELECT r.code,
           CASE r.code
               WHEN 'target_not_found' THEN format('execution %s not found', p_target)
               WHEN 'target_finished' THEN format(
                   'execution %s is %s: it takes no more signals', p_target, p_finished)
               WHEN 'gate_closed' THEN format(
                   'execution %s already received %L, one of its gates: the first signal '
                   'of a gate stands and no later one replaces it', p_target, p_name)
               WHEN 'target_refused' THEN CASE
                   WHEN p_pending >= p_max_pending THEN format(
                       'execution %s already has %s unconsumed signals named %L (at most %s)',
                       p_target, p_pending, p_name, p_max_pending)
                   ELSE format('execution %s already has %s unconsumed signals (at most %s)',
                               p_target, p_pending_total, p_max_pending_total)
               END
           END
    FROM (SELECT CASE
              WHEN p_run_tenant IS DISTINCT FROM p_tenant THEN 'target_not_found'
              WHEN p_earlier_id IS NOT NULL THEN NULL
              WHEN p_finished IS NOT NULL THEN 'target_finished'
              WHEN p_gate_closed THEN 'gate_closed'
              WHEN p_pending >= p_max_pending OR p_pending_total >= p_max_pending_total
                  THEN 'target_refused'
          END AS code) r
$$;
