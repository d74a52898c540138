-- A keyed run's task row went (it finished, parked on a signal or a person,
-- or was cancelled): an AFTER DELETE trigger on tasks (schema/0020) that gives
-- the freed slot to the key's next queued run in the same transaction.
CREATE OR REPLACE FUNCTION shardq.release_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('shardq.moving', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM shardq.promote_queued(OLD.concurrency_key);
    RETURN NULL;
END
$$;
