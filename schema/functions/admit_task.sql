-- Admission of a keyed run's task row (schema/0020; docs/flow-control.md): a
-- BEFORE INSERT trigger on tasks, for rows with a concurrency key only. The
-- row goes in, and the key's `held` counts it, while the key holds fewer than
-- its limit; otherwise the run waits in key_queue and the insert is skipped
-- (RETURN NULL), so the inserting statement sees no row, returns none and
-- wakes no worker.
--
-- Every admission and release on a shard holds one transaction-scoped advisory
-- lock (shardq.admission_lock): with it, `held` is exact (no other transaction
-- has keyed rows in flight), and a transaction that touches many keys cannot
-- deadlock with another over them, which per-key locks taken in the order of a
-- statement's rows would. Callers take it after their task-row locks and hold
-- nothing a holder of it waits for. The price: keyed commits on one shard
-- queue for it; unkeyed ones never take it.
--
-- A move copies rows as they are, already admitted on the source, and
-- fill_slots.sql promotes runs it has counted itself: they set
-- shardq.slots_counted, and the trigger's WHEN clause skips it (schema/0020).
CREATE OR REPLACE FUNCTION shardq.admit_task() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    free boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(shardq.admission_lock_key());
    -- INSERT ... ON CONFLICT runs this trigger before it finds the conflict: a
    -- row already there holds the run's slot, and the conflict path updates it.
    IF EXISTS (SELECT 1 FROM shardq.tasks t WHERE t.execution_id = NEW.execution_id) THEN
        RETURN NEW;
    END IF;
    SELECT k.held < coalesce(k.override, k.declared) INTO free
    FROM shardq.concurrency_keys k WHERE k.key = NEW.concurrency_key;
    IF free IS NULL THEN
        -- The key's row went idle and the housekeeping deleted it (no slot held, no
        -- run waiting, no operator limit): a woken run brings it back with the limit
        -- its start declared. A start declares its key just before (declare_limits,
        -- which keeps an idle key's row from being deleted under it).
        INSERT INTO shardq.concurrency_keys (key, bucket, declared)
        SELECT NEW.concurrency_key, shardq.bucket(NEW.execution_id), e.concurrency_limit
        FROM shardq.executions e
        WHERE e.id = NEW.execution_id AND e.concurrency_limit IS NOT NULL
        ON CONFLICT (key) DO NOTHING;
        SELECT k.held < coalesce(k.override, k.declared) INTO free
        FROM shardq.concurrency_keys k WHERE k.key = NEW.concurrency_key;
    END IF;
    IF free IS NULL THEN
        -- No limit anywhere: a bug, not a reason to run unlimited.
        RAISE EXCEPTION 'concurrency key % has no limit on this shard', NEW.concurrency_key;
    END IF;
    IF free THEN
        UPDATE shardq.concurrency_keys k SET held = k.held + 1 WHERE k.key = NEW.concurrency_key;
        -- A run woken (claims > 0) may have been waiting for a slot: it has one now.
        -- A new run cannot have, and a promoted one left the queue already.
        IF NEW.claims > 0 THEN
            DELETE FROM shardq.key_queue q WHERE q.execution_id = NEW.execution_id;
        END IF;
        RETURN NEW;
    END IF;
    INSERT INTO shardq.key_queue AS q (execution_id, concurrency_key, priority, claims)
    VALUES (NEW.execution_id, NEW.concurrency_key, NEW.priority, NEW.claims)
    ON CONFLICT (execution_id) DO UPDATE SET claims = greatest(q.claims, excluded.claims);
    RETURN NULL;
END
$$;
