-- A keyed run's task row went, one row at a time (a cancel, a parked run
-- woken and parked again; a worker's commit releases its batch in one set
-- instead, release_slots.sql): an AFTER DELETE trigger on tasks (schema/0020).
CREATE OR REPLACE FUNCTION shardq.release_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM shardq.release_slots(ARRAY[OLD.concurrency_key]);
    RETURN NULL;
END
$$;
