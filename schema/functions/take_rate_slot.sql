-- A slot of limiter `p_limiter` for one call of a step (schema/0022;
-- docs/flow-control.md): the seconds until the step may start. 0: now. Up to
-- `p_park_after`: the caller waits that long in process and starts the step,
-- nothing kept. Longer: the slot is kept as the call's reservation and the
-- caller parks its run until then; its next turn asks again for the same call
-- (position, attempt) and is given the reserved slot, not a new one. NULL: this
-- shard holds no such limiter (the caller declares it and asks again).
--
-- A new slot moves the limiter's tat one interval on, under the row's lock:
-- slots never overlap, whichever worker or shard asks. A reservation the step
-- takes is deleted with the answer, so a step that runs again after a crash
-- takes a slot of its own, never one already spent.
CREATE OR REPLACE FUNCTION shardq.take_rate_slot(
    p_limiter text, p_run uuid, p_position integer, p_attempt integer, p_park_after float8)
RETURNS float8
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    slot timestamptz;
    wait float8;
BEGIN
    SELECT r.at INTO slot FROM shardq.rate_reservations r
    WHERE r.execution_id = p_run AND r.position = p_position AND r.attempt = p_attempt
      AND r.limiter = p_limiter;
    IF FOUND THEN
        wait := extract(epoch FROM slot - now());
        IF wait <= p_park_after THEN
            DELETE FROM shardq.rate_reservations r
            WHERE r.execution_id = p_run AND r.position = p_position
              AND r.attempt = p_attempt AND r.limiter = p_limiter;
        END IF;
        RETURN greatest(wait, 0);
    END IF;

    UPDATE shardq.rate_limiters l
    SET tat = greatest(l.tat, now()) + make_interval(
            secs => coalesce(l.o_period_s, l.period_s) / coalesce(l.o_rate, l.rate))
    WHERE l.name = p_limiter
    RETURNING greatest(now(), l.tat - make_interval(
            secs => coalesce(l.o_burst, l.burst) * coalesce(l.o_period_s, l.period_s)
                    / coalesce(l.o_rate, l.rate)))
    INTO slot;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    wait := extract(epoch FROM slot - now());
    IF wait > p_park_after THEN
        INSERT INTO shardq.rate_reservations AS r (execution_id, position, attempt, limiter, at)
        VALUES (p_run, p_position, p_attempt, p_limiter, slot)
        ON CONFLICT (execution_id, position, attempt, limiter) DO UPDATE SET at = excluded.at;
        -- Slots of runs that never came back for them (cancelled, failed): a few
        -- at a time, oldest first, so the table stays the size of the waiting.
        DELETE FROM shardq.rate_reservations r
        WHERE r.ctid = ANY(ARRAY(
            SELECT o.ctid FROM shardq.rate_reservations o
            WHERE o.limiter = p_limiter AND o.at < now() - interval '1 hour'
            ORDER BY o.at LIMIT 10));
    END IF;
    RETURN greatest(wait, 0);
END
$$;
