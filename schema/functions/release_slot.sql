-- A keyed run's task row went (it finished, parked on a signal or a person,
-- or was cancelled): an AFTER DELETE trigger on tasks (schema/0020) that gives
-- the freed slot back to its key and, when the key has a free slot now (its
-- limit may have been lowered), to the key's next queued run, in the same
-- transaction.
CREATE OR REPLACE FUNCTION shardq.release_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    free integer;
BEGIN
    IF current_setting('shardq.moving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(shardq.admission_lock_key());
    UPDATE shardq.concurrency_keys k SET held = k.held - 1
    WHERE k.key = OLD.concurrency_key
    RETURNING coalesce(k.override, k.declared) - k.held INTO free;
    IF free > 0 THEN
        PERFORM shardq.promote_queued(OLD.concurrency_key, free);
    END IF;
    RETURN NULL;
END
$$;
