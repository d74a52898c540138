-- The slots of keyed task rows just deleted (one key per row), given back in
-- one set: each key's `held` goes down, and a key left with a free slot (its
-- limit may have been lowered meanwhile) gives it to a queued run
-- (fill_slots.sql). Answers how many were promoted.
--
-- Every statement that deletes task rows outside a move calls it for the rows
-- it deleted: a worker's commit (commit_turns_v2, with the keys finish_tasks
-- answers on its fused path) once for its batch, a cancel for its run. The
-- first cut released row by row in a trigger, several statements per run:
-- measured, ~85 us of server time per limited job, most of the gap between a
-- limited drain and an unlimited one.
--
-- Under the admission lock, taken first (see admit_task.sql): `held` is exact,
-- and no one else changes the key rows meanwhile.
CREATE OR REPLACE FUNCTION shardq.release_slots(p_keys text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    open_keys text[];
BEGIN
    PERFORM pg_advisory_xact_lock(shardq.admission_lock_key());
    WITH freed AS (
        SELECT f.key, count(*)::integer AS n FROM unnest(p_keys) AS f(key) GROUP BY f.key
    ), released AS (
        UPDATE shardq.concurrency_keys k SET held = k.held - f.n
        FROM freed f WHERE k.key = f.key
        RETURNING k.key, coalesce(k.override, k.declared) > k.held AS open
    )
    SELECT array_agg(r.key) INTO open_keys FROM released r WHERE r.open;
    IF open_keys IS NULL THEN
        RETURN 0;
    END IF;
    RETURN shardq.fill_slots(open_keys);
END
$$;
