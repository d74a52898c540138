-- A slot of limiter `p_limiter` for one call of a step (schema/0022;
-- docs/flow-control.md): the seconds until the step may start. 0: now. Up to
-- `p_park_after`: the caller waits that long in process and starts the step,
-- the start counted now. Longer: the slot is kept as the call's reservation and
-- the caller parks its run until then; its next turn asks again for the same
-- call (position, attempt) and is given the reserved slot, not a new one. NULL:
-- this shard holds no such limiter (the caller declares it and asks again).
--
-- A new call takes a planned slot from tat (its place in line); a call whose
-- planned slot has come takes its start from sat, no sooner than an interval
-- after the start before it (burst: that many at once after a quiet spell).
-- Both under the row's lock: whichever worker or shard asks, slots never
-- overlap and starts never bunch. A reservation whose start is given is
-- deleted with the answer, so a step that runs again after a crash takes a
-- slot of its own, never one already spent.
CREATE OR REPLACE FUNCTION shardq.take_rate_slot(
    p_limiter text, p_run uuid, p_position integer, p_attempt integer, p_park_after float8)
RETURNS float8
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    step interval;
    early interval;
    planned timestamptz;
    start timestamptz;
    reserved boolean;
BEGIN
    SELECT make_interval(secs => coalesce(l.o_period_s, l.period_s) / coalesce(l.o_rate, l.rate)),
           make_interval(secs => (coalesce(l.o_burst, l.burst) - 1)
                                 * coalesce(l.o_period_s, l.period_s) / coalesce(l.o_rate, l.rate)),
           greatest(now(), l.sat - make_interval(secs => (coalesce(l.o_burst, l.burst) - 1)
                                 * coalesce(l.o_period_s, l.period_s) / coalesce(l.o_rate, l.rate)))
    INTO step, early, start
    FROM shardq.rate_limiters l WHERE l.name = p_limiter
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    SELECT r.at INTO planned FROM shardq.rate_reservations r
    WHERE r.execution_id = p_run AND r.position = p_position AND r.attempt = p_attempt
      AND r.limiter = p_limiter;
    reserved := FOUND;
    IF NOT reserved THEN
        UPDATE shardq.rate_limiters l SET tat = greatest(l.tat, now()) + step
        WHERE l.name = p_limiter
        RETURNING greatest(now(), l.tat - step - early) INTO planned;
    END IF;
    start := greatest(start, planned);

    IF extract(epoch FROM start - now()) > p_park_after THEN
        INSERT INTO shardq.rate_reservations AS r (execution_id, position, attempt, limiter, at)
        VALUES (p_run, p_position, p_attempt, p_limiter, start)
        ON CONFLICT (execution_id, position, attempt, limiter) DO UPDATE SET at = excluded.at;
        IF NOT reserved THEN
            -- Slots of runs that never came back for them (cancelled, failed): a
            -- few at a time, oldest first, so the table stays the size of the waiting.
            DELETE FROM shardq.rate_reservations r
            WHERE r.ctid = ANY(ARRAY(
                SELECT o.ctid FROM shardq.rate_reservations o
                WHERE o.limiter = p_limiter AND o.at < now() - interval '1 hour'
                ORDER BY o.at LIMIT 10));
        END IF;
        RETURN extract(epoch FROM start - now());
    END IF;

    UPDATE shardq.rate_limiters l SET sat = greatest(l.sat, start) + step
    WHERE l.name = p_limiter;
    IF reserved THEN
        DELETE FROM shardq.rate_reservations r
        WHERE r.execution_id = p_run AND r.position = p_position
          AND r.attempt = p_attempt AND r.limiter = p_limiter;
    END IF;
    RETURN greatest(extract(epoch FROM start - now()), 0);
END
$$;
