-- The timeouts of a commit batch that the store does not grant (yet), for
-- commit_turns_v2: a timed wait's outcome is decided by the times the store
-- recorded, not by when a worker happened to run.
--
-- A worker records `signal.timed_out`, `condition.timed_out` or
-- `interrupt.timed_out` from what its claim read and its estimate of the
-- database's clock. The store grants it only when
-- - the commit's transaction began at or after the deadline written at park
--   time (the `wake_at` of the wait's opening event): its events are recorded
--   at that beginning (now()), so a timeout granted to a transaction begun
--   before it would be recorded as happening before its deadline (a batch that
--   began 1.5 ms early did: tests/integration/test_waits.py), and
-- - nothing that satisfies the wait arrived by that deadline: for a signal
--   or condition wait, an unconsumed signal of a name it waits on received
--   at or before the deadline (other than those this very commit consumes);
--   for an interrupt, a decision recorded at its position.
-- Such a signal or decision committed after the turn's claim read the run
-- (its sender locked the run's task row first; the fence waited for it). A
-- run whose timeout is not granted gets none of its commit: its task row
-- keeps the lease token (a retry after a broken connection is then told it
-- did not land) and is due again at the deadline, where the next turn sees
-- what arrived. The answer is those runs, for the caller to drop from its
-- fence. A wait whose opening event is missing is never held back: a run
-- must not loop on a deadline nobody can read.
CREATE OR REPLACE FUNCTION shardq.defer_premature_timeouts(
    p_fenced    uuid[],
    e_ids       uuid[],
    e_positions integer[],
    e_kinds     text[],
    s_ids       bigint[]
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    held uuid[];
BEGIN
    WITH timeout AS (
        SELECT e.id, e.position, e.kind
        FROM unnest(e_ids, e_positions, e_kinds) AS e(id, position, kind)
        WHERE e.kind IN ('signal.timed_out', 'condition.timed_out', 'interrupt.timed_out')
          AND e.id = ANY(p_fenced)
    ), opened AS (
        SELECT t.id, t.position, t.kind, o.name, o.payload->'signals' AS names,
               (o.payload->>'wake_at')::timestamptz AS deadline
        FROM timeout t
        CROSS JOIN LATERAL (
            SELECT h.name, h.payload FROM shardq.history h
            WHERE h.execution_id = t.id AND h.position = t.position
              AND h.kind IN ('signal.waiting', 'condition.waiting', 'interrupt.requested')
            LIMIT 1
        ) o
    ), early AS (
        SELECT o.id, o.deadline FROM opened o
        WHERE o.deadline > now()
           OR (o.kind = 'interrupt.timed_out' AND EXISTS (
                SELECT 1 FROM shardq.history h
                WHERE h.execution_id = o.id AND h.position = o.position
                  AND h.kind = 'interrupt.decided'))
           OR (o.kind <> 'interrupt.timed_out' AND EXISTS (
                SELECT 1 FROM shardq.signals s
                WHERE s.execution_id = o.id AND s.consumed_at IS NULL
                  AND s.received_at <= o.deadline
                  AND NOT s.id = ANY(coalesce(s_ids, '{}'))
                  AND CASE WHEN o.kind = 'signal.timed_out' THEN s.name = o.name
                           ELSE coalesce(o.names ? s.name, false) END))
    ), deferred AS (
        UPDATE shardq.tasks t
        SET leased_until = NULL,
            run_at = greatest(now(), (SELECT max(e.deadline) FROM early e
                                      WHERE e.id = t.execution_id))
        WHERE t.execution_id IN (SELECT e.id FROM early e)
        RETURNING t.execution_id
    )
    SELECT coalesce(array_agg(d.execution_id), '{}') INTO held FROM deferred d;
    IF cardinality(held) > 0 THEN
        -- Due now or at the deadline: a claim loop re-reads its next due time.
        PERFORM pg_notify(shardq.wake_channel(), '');
    END IF;
    RETURN held;
END
$$;
